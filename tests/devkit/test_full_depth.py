"""benchmarks/full_depth_e2e.py's logic without a GPU: the report from known rows, the CPU-offload MODEL rows,
the engine settings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "full_depth_e2e.py"
_spec = importlib.util.spec_from_file_location("full_depth_e2e", _PATH)
full_depth = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = full_depth
_spec.loader.exec_module(full_depth)

META = {"gpu": "TEST GPU", "commit": "abc1234", "date": "2026-12-01 00:00", "vllm": "0.0", "torch": "0.0",
        "vocab": 248320, "gpu_total_gb": 150.0, "protocol": "512 in / 256 out"}


def _row(engine: str, mode: str, batch: int, decode: float) -> dict:
    return {"engine": engine, "mode": mode, "max_model_len": 4096, "batch": batch, "ttft_ms_mean": 100.0,
            "ttft_ms_p50": 100.0, "prefill_tok_s": 5120.0 * batch, "decode_tok_s": decode,
            "decode_tok_s_per_seq": decode / batch, "gpu_us_all": 1e6 / decode, "gpu_us_linear": 5e5 / decode}


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / full_depth.FP16_DIR).mkdir()
    config = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen3.8-27b-config.json").read_text())
    (tmp_path / full_depth.FP16_DIR / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_report_names_gpu_commit_and_version_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{**_row("fp16, whole GPU", mode, batch, 20.0 * batch), "measured_at": "2026-11-30 10:00", "commit": commit}
            for mode, commit in (("default", "old0001"), ("eager", "new0002")) for batch in (1, 4)]
    written = full_depth.render(rows, META, tmp_path, "full-depth-test-gpu")
    assert written[0].name == "full-depth-test-gpu.md"
    text = written[0].read_text()
    assert "TEST GPU" in text and "abc1234" in text and "vLLM 0.0" in text
    assert "max-model-len of the rows: 4096;" in text  # from the rows, not from the rendering call's protocol
    assert text.count("| fp16, whole GPU |") == 4
    # rows measured at other commits than the render's say so (the table gathers several device calls)
    assert text.count("| 2026-11-30 10:00, old0001 |") == 2 and text.count(", new0002 |") == 2
    assert written[1].suffix == ".png" and written[1].stat().st_size > 1000


def test_offload_model_rows_add_the_pcie_time_per_step(workdir):
    protocol = full_depth.benchmark.Protocol()
    fp16 = [_row("fp16, whole GPU", "default", 1, 50.0)]
    modelled = full_depth.offload_model_rows(fp16, 10e9, workdir, protocol)[0]
    offloaded = full_depth.v100_budget.offloaded_bytes(full_depth.v100_budget.load_shape(workdir / "fp16-config-only"),
                                                       full_depth.v100_budget.ENGINES[3], 8, 8192)
    assert offloaded > 20e9  # 54 GB of fp16 weights against a 29 GB budget
    assert modelled["decode_tok_s"] == pytest.approx(1 / (1 / 50.0 + offloaded / 10e9))
    assert modelled["engine"].startswith("MODEL:")


def test_engine_settings(workdir):
    protocol = full_depth.benchmark.Protocol()
    offload = full_depth.engine_args(full_depth.ENGINES["fp16-offload"], workdir, "default", protocol)
    assert offload["load_format"] == "dummy" and offload["cpu_offload_gb"] > 20 and not offload["enforce_eager"]
    quantized = full_depth.engine_args(full_depth.ENGINES["w4a16"], workdir, "eager", protocol)
    assert quantized["quantization"] == "volta_nvfp4" and quantized["enforce_eager"]
    assert quantized["compilation_config"] == {"custom_ops": ["none"]}
    # every engine on the plugin's attention backend (the GPU kit has no FlashAttention for vLLM to pick)
    assert offload["attention_backend"] == quantized["attention_backend"] == "CUSTOM"


def test_each_max_model_len_is_its_own_engine_and_a_failure_keeps_the_other_rows(workdir, monkeypatch):
    """Stage 5 on the H200 lost the finished 4096-token engine's rows when the 8192-token one failed to start."""
    pytest.importorskip("vllm")
    started = []

    def run_engine(spec, mode, workdir_, protocol):
        (length,) = protocol.max_model_lens
        started.append((spec.name, mode, length))
        if length == 8192:
            raise ValueError("max_model_len 8192 > max_position_embeddings")
        return [{**_row(spec.name, mode, 1, 30.0), "max_model_len": length}]

    monkeypatch.setattr(full_depth, "run_engine", run_engine)
    args = SimpleNamespace(preload=[], input_len=512, output_len=256, batches=(1,), max_model_lens=(4096, 8192),
                           repeats=1, workdir=workdir, commit="abc1234", engines=["mixed"], modes=["default"],
                           out_dir=workdir / "out", stem="full-depth-test", no_plot=True)
    assert full_depth.bench(args) == 1
    name = full_depth.ENGINES["mixed"].name
    assert started == [(name, "default", 4096), (name, "default", 8192)]
    stored = json.loads((workdir / "results.json").read_text())
    assert [(row["engine"], row["max_model_len"]) for row in stored] == [(name, 4096)]
    assert stored[0]["commit"] == "abc1234" and stored[0]["measured_at"]  # each row says which call measured it
    assert (workdir / "out" / "full-depth-test.md").exists()


def test_the_full_depth_shape_takes_max_model_len_8192():
    """The checkpoint's max_position_embeddings is Qwen3.8-27B's, so vLLM accepts max-model-len 8192 without an
    override (it was 4096: the 8192 engines could not start)."""
    pytest.importorskip("transformers")
    from vllm_volta_fp4.testing.tiny_model import qwen3_5_config, qwen3_8_27b

    real = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen3.8-27b-config.json").read_text())
    text = qwen3_5_config(qwen3_8_27b(2), 1024)["text_config"]
    assert text["max_position_embeddings"] == real["text_config"]["max_position_embeddings"] == 262144
