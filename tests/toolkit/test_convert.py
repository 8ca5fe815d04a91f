"""volta-fp4 convert: output equal to the reference dequantization of the source tensors (read here straight from
the safetensors files, not through Checkpoint), loadable by transformers, no overwrite without --force, progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vllm_volta_fp4.cli import main
from vllm_volta_fp4.format.checkpoint import Checkpoint
from vllm_volta_fp4.format.nvfp4 import dequantize_fp8, dequantize_nvfp4
from vllm_volta_fp4.testing.tiny_model import FORMATS
from vllm_volta_fp4.toolkit.convert import convert_to_dense

# Per producer: (packed weight, block scale, global scale, is the global scale the inverse (encode) scale)
NVFP4_NAMES = {"modelopt": ("weight", "weight_scale", "weight_scale_2", False),
               "ct": ("weight_packed", "weight_scale", "weight_global_scale", True)}


def read_all(model_dir) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


def reference_dense(source: dict[str, torch.Tensor], producer: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Dense tensors by the reference codecs: NVFP4 modules are those with a global scale, FP8 ones have an e4m3
    weight; everything else is copied in ``dtype``."""
    packed, block, global_name, inverse = NVFP4_NAMES[producer]
    dense, consumed = {}, set()
    for name in source:
        module, _, leaf = name.rpartition(".")
        if leaf == global_name:
            scale = source[name].float().reshape(())
            dense[f"{module}.weight"] = dequantize_nvfp4(source[f"{module}.{packed}"], source[f"{module}.{block}"],
                                                         1.0 / scale if inverse else scale, dtype)
            consumed |= {f"{module}.{leaf}" for leaf in (packed, block, global_name, "input_scale",
                                                         "input_global_scale")}
        elif leaf == "weight" and source[name].dtype == torch.float8_e4m3fn:
            dense[name] = dequantize_fp8(source[name], source[f"{module}.weight_scale"], dtype)
            consumed |= {name, f"{module}.weight_scale", f"{module}.input_scale"}
    for name, tensor in source.items():
        if name not in consumed:
            dense[name] = tensor.to(dtype)
    return dense


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_equals_the_reference_dequantization(tiny_checkpoints, tmp_path, fmt):
    dst = tmp_path / "dense"
    assert main(["convert", str(tiny_checkpoints[fmt]), str(dst)]) == 0
    converted = read_all(dst)
    expected = reference_dense(read_all(tiny_checkpoints[fmt]), fmt.split("-")[0], torch.float16)
    assert converted.keys() == expected.keys()
    for name, tensor in expected.items():
        assert converted[name].dtype == torch.float16 and torch.equal(converted[name], tensor), name
    config = json.loads((dst / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == config["torch_dtype"] == "float16"
    assert not (dst / "hf_quant_config.json").exists()


def test_converted_model_loads_in_transformers_and_runs(tiny_checkpoints, tmp_path):
    transformers = pytest.importorskip("transformers")
    dst = tmp_path / "dense"
    assert main(["convert", str(tiny_checkpoints["modelopt-mixed"]), str(dst), "--dtype", "float32"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(dst)
    tokenizer = transformers.AutoTokenizer.from_pretrained(dst)
    dense = read_all(dst)
    loaded = model.state_dict()
    assert torch.equal(loaded["model.layers.0.mlp.down_proj.weight"], dense["model.layers.0.mlp.down_proj.weight"])
    inputs = tokenizer("the capital of france is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_refuses_to_overwrite_without_force_and_shows_progress(tiny_checkpoints, tmp_path):
    # a subprocess, as a user runs it: Progress writes to the process's real stderr
    src, dst = tiny_checkpoints["ct-w4a16"], tmp_path / "dense"

    def convert(*extra):
        return subprocess.run([sys.executable, "-m", "vllm_volta_fp4.cli", "convert", str(src), str(dst), *extra],
                              capture_output=True, text=True, timeout=300)

    first = convert()
    assert first.returncode == 0, first.stderr
    converted = len(read_all(dst))
    assert f"convert: {converted}/{converted}" in first.stderr and f"verify: {converted}/{converted}" in first.stderr
    refused = convert()
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert convert("--force").returncode == 0 and len(read_all(dst)) == converted  # a previous conversion is replaced
    marker = dst / "keep-me"
    marker.write_text("user data")
    refused = convert("--force")  # ... but never a file convert did not write
    assert refused.returncode == 2 and "'keep-me', which convert did not write" in refused.stderr
    assert marker.read_text() == "user data" and len(read_all(dst)) == converted


def test_qwen3_5_hybrid_converts_and_runs_in_transformers(tmp_path):
    """The Gated-DeltaNet hybrid with its vision tower converts to a dense checkpoint transformers loads and runs
    (text only); 16-bit tensors (vision tower, GDN b/a, conv1d, A_log) pass through unchanged."""
    transformers = pytest.importorskip("transformers")
    from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint

    source = make_tiny_checkpoint(tmp_path / "q35", "qwen3_5", "ct-w4a16")
    dense = convert_to_dense(source, tmp_path / "q35-dense", dtype=torch.float32)
    checkpoint = Checkpoint(source)
    for name in ("model.visual.blocks.0.attn.qkv.weight", "model.language_model.layers.0.linear_attn.in_proj_b.weight",
                 "model.language_model.layers.0.linear_attn.conv1d.weight",
                 "model.language_model.layers.0.linear_attn.A_log"):
        weight_map = json.loads((dense / "model.safetensors.index.json").read_text())["weight_map"]
        written = load_file(dense / weight_map[name])
        assert torch.equal(written[name], checkpoint.load(name).float()), name
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(dense, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 17, 42, 99, 7]])).logits
    assert logits.shape[-1] == model.config.text_config.vocab_size and torch.isfinite(logits).all()


def _tree(directory) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


@pytest.mark.parametrize("where", ["the source itself", "the source's parent", "inside the source"])
def test_force_never_touches_the_source_or_its_surroundings(fresh_checkpoint, capsys, where):
    src = fresh_checkpoint("ct-w4a16")
    unrelated = src.parent / "unrelated.txt"
    unrelated.write_text("someone else's data")
    before = _tree(src.parent)
    dst = {"the source itself": src, "the source's parent": src.parent, "inside the source": src / "dense"}[where]
    assert main(["convert", str(src), str(dst), "--force"]) == 2
    message = capsys.readouterr().err
    assert "write the conversion to a separate directory" in message and "Traceback" not in message
    assert _tree(src.parent) == before


@pytest.mark.parametrize("kind", ["an existing file", "below a file"])
def test_a_destination_that_cannot_be_a_directory_is_a_clear_error(tiny_checkpoints, tmp_path, capsys, kind):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    dst = blocker if kind == "an existing file" else blocker / "dense"
    assert main(["convert", str(tiny_checkpoints["ct-w4a16"]), str(dst)]) == 2
    message = capsys.readouterr().err
    assert str(dst) in message and "Traceback" not in message and message.count("\n") == 1
    assert blocker.read_text() == "not a directory"


def test_a_checkpoint_inspect_refuses_is_not_converted(fresh_checkpoint, tmp_path, capsys):
    src = fresh_checkpoint("ct-w4a16")
    module = "model.layers.0.mlp.up_proj"
    index_file = src / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = src / index["weight_map"].pop(f"{module}.weight_packed")
    tensors = load_file(shard)
    del tensors[f"{module}.weight_packed"]
    from safetensors.torch import save_file

    save_file(tensors, shard)
    index_file.write_text(json.dumps(index))
    assert main(["inspect", str(src)]) == 2
    refusal = capsys.readouterr().err.partition(": ")[2]
    assert main(["convert", str(src), str(tmp_path / "dense")]) == 2
    assert capsys.readouterr().err.partition(": ")[2] == refusal and f"{module}.weight_packed" in refusal
    assert not (tmp_path / "dense").exists()


def test_written_files_follow_the_umask_and_transformers_reads_the_dtype(tiny_checkpoints, tmp_path):
    transformers = pytest.importorskip("transformers")
    previous = os.umask(0o027)
    try:
        dst = convert_to_dense(tiny_checkpoints["modelopt-w4a16"], tmp_path / "dense", dtype=torch.float32)
    finally:
        os.umask(previous)
    assert {path.name: path.stat().st_mode & 0o777 for path in dst.iterdir()} == {
        path.name: 0o640 for path in dst.iterdir()}
    assert transformers.AutoConfig.from_pretrained(dst).dtype == torch.float32  # the source said float16
