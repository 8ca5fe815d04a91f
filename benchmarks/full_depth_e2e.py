#!/usr/bin/env python3
"""The seeds' benchmark at full depth: Qwen3.8-27B's real shape (64 layers = 48 Gated DeltaNet + 16 gated
attention, vocabulary 248,320, fp16 embeddings and lm_head), random weights, on one GPU in one run.

Engines (``--engines``): volta_nvfp4 on the compressed-tensors W4A16 checkpoint and on the ModelOpt mixed one (FP8
attention/GDN projections, NVFP4 MLP), both with GPU memory capped to what a V100-32GB gives vLLM (0.9 × 32 GB);
fp16 with the whole GPU (the 54 GB a V100 cannot hold), and fp16 with ``cpu_offload_gb`` so that it fits the same
cap (the seeds' baseline). The fp16 engines get the same shapes from a config-only directory with
``load_format="dummy"``. Each in vLLM's default mode (torch.compile + CUDA graphs) and eager (``--modes``).

Protocol: toolkit.benchmark's (the one ``volta-fp4 bench --offline`` runs): 512 prompt / 256 generated tokens,
batch 1, 4, 8, max-model-len 4096 and 8192 → TTFT, prefill and decode tok/s; plus, on each engine, the GPU kernel
time per decode step split by kernel family (devkit.gpu_time) at every batch size. If the offload engine cannot
start, the H2D bandwidth of pinned host memory is measured and that baseline is reported as a labelled MODEL.

Phases (so that one device call stays under 10 minutes; see scripts/gpu/run_full_depth_gpu.sh):
  checkpoint  write the NVFP4 checkpoint(s) of ``--formats`` and the fp16 config-only directory into --workdir
  bench       run the engines; every finished engine's rows are appended to WORKDIR/results.json, and the
              markdown table, CSV and PNG are re-rendered from all rows so far into --out-dir

    python3 benchmarks/full_depth_e2e.py checkpoint --workdir /tmp/full-depth [--layers 64] [--vocab 248320]
    python3 benchmarks/full_depth_e2e.py bench --workdir /tmp/full-depth --out-dir $OUT --engines w4a16 \\
        --modes default,eager --commit abc1234 [--preload scripts/gpu/uva_view_standin.py]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import runpy
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import v100_budget  # noqa: E402

from devkit.gpu_time import FAMILIES, gpu_time_per_decode_token  # noqa: E402
from vllm_volta_fp4.plugin.attention.backend import BACKEND_NAME  # noqa: E402
from vllm_volta_fp4.testing.greedy import ENGINE_MODES  # noqa: E402
from vllm_volta_fp4.testing.tiny_model import qwen3_8_27b, stream_hybrid_checkpoint  # noqa: E402
from vllm_volta_fp4.toolkit import benchmark, planner  # noqa: E402

GIB = 1 << 30
FULL_VOCAB = 248320
V100_BUDGET_BYTES = 0.9 * planner.GPU_PRESETS["v100-32gb"]  # what vLLM gets on a V100-32GB at utilisation 0.9
FP16_DIR = "fp16-config-only"
MODES = ENGINE_MODES


@dataclass(frozen=True)
class EngineSpec:
    key: str
    name: str
    checkpoint: str  # a producer format of tiny_model, or FP16_DIR
    v100_memory: bool  # capped to a V100-32GB's share, else the whole GPU
    offload: bool = False
    # Tokens generated per request instead of the protocol's, where its 256 would not fit a device call: the
    # offload engine reads its offloaded weights over PCIe every step (~0.6 s on the H200). Decode tok/s is a
    # per-step rate either way; the table says how many tokens each row generated.
    output_len: int | None = None
    # Decode steps the torch profiler records per batch for the GPU-time split (the offload engine's steps take
    # ~0.6 s each, and profiling 32 of them at three batch sizes outran a device call).
    profile_steps: int = 32


ENGINES = {spec.key: spec for spec in (
    EngineSpec("w4a16", "volta_nvfp4 (compressed-tensors W4A16)", "ct-w4a16", v100_memory=True),
    EngineSpec("mixed", "volta_nvfp4 (ModelOpt mixed: FP8 attention, NVFP4 MLP)", "modelopt-mixed", v100_memory=True),
    EngineSpec("fp16", "fp16, whole GPU", FP16_DIR, v100_memory=False),
    EngineSpec("fp16-offload", "fp16 + cpu_offload_gb to fit 32 GB (seeds' baseline)", FP16_DIR, v100_memory=True,
               offload=True, output_len=32, profile_steps=4),
)}


def write_checkpoints(workdir: Path, formats: list[str], layers: int, vocab: int, device: str) -> None:
    # with its one-layer MTP module, as the real export ships it (16-bit, excluded from quantization): the plain
    # engines leave it unloaded; benchmarks/mtp_round_cost.py --model runs it at full depth
    shape = replace(qwen3_8_27b(layers), mtp_layers=1)
    for fmt in formats:
        if (workdir / fmt / "model.safetensors.index.json").exists():
            print(f"{fmt}: already written", flush=True)
            continue
        start = time.perf_counter()
        print(f"writing the {layers}-layer {fmt} checkpoint (vocabulary {vocab}) on {device} …", flush=True)
        stream_hybrid_checkpoint(workdir / fmt, shape, fmt, device=device, vocab=vocab,
                                 progress=lambda line: print(line, flush=True))
        print(f"{fmt}: {time.perf_counter() - start:.0f} s, free disk {shutil.disk_usage(workdir).free / 1e9:.0f} GB",
              flush=True)
    source = workdir / formats[0]
    fp16 = workdir / FP16_DIR
    fp16.mkdir(exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float16"
    (fp16 / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, fp16 / name)


def engine_args(spec: EngineSpec, workdir: Path, mode: str, protocol: benchmark.Protocol) -> dict:
    import torch

    total = torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else None
    # Every engine on the plugin's attention backend: what a V100 runs (the platform's choice on compute capability
    # 7.x), and on the H200 the GPU kit has no FlashAttention build for vLLM to pick.
    args = {**MODES[mode], "dtype": "float16", "seed": 0, "enable_prefix_caching": False,
            "language_model_only": True, "gdn_prefill_backend": "triton", "attention_backend": BACKEND_NAME}
    if total is not None:
        args["gpu_memory_utilization"] = round(V100_BUDGET_BYTES / total, 4) if spec.v100_memory else 0.9
    if spec.checkpoint == FP16_DIR:
        args["load_format"] = "dummy"
    else:
        args["quantization"] = "volta_nvfp4"
    if spec.offload:
        shape = v100_budget.load_shape(workdir / FP16_DIR)
        offload = v100_budget.offloaded_bytes(shape, v100_budget.ENGINES[3], max(protocol.batches),
                                              max(protocol.max_model_lens))
        args["cpu_offload_gb"] = math.ceil(offload / GIB) + 1
    return args


def measure_pcie_h2d(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of pinned host → GPU copies (median of ``repeats``)."""
    import statistics

    import torch

    host = torch.empty(int(gib * GIB), dtype=torch.uint8, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    samples = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        device.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        samples.append(host.numel() / (start.elapsed_time(end) / 1e3))
    return statistics.median(samples[1:])


def run_engine(spec: EngineSpec, mode: str, workdir: Path, protocol: benchmark.Protocol) -> list[dict]:
    """Protocol rows of one engine in one mode, each with its GPU time per decode step by kernel family."""
    from vllm_volta_fp4.testing.greedy import supported_engine_args

    if spec.output_len:
        protocol = replace(protocol, output_len=spec.output_len)
    args = supported_engine_args(engine_args(spec, workdir, mode, protocol))
    print(f"=== {spec.name}, {mode}: {args}", flush=True)
    gpu_times: dict[tuple[int, int], dict[str, float]] = {}
    steps = min(spec.profile_steps, protocol.output_len)

    def profile(target: benchmark.OfflineTarget, max_model_len: int) -> None:
        prompt = benchmark.prompt_ids_of_length(target.tokenize, protocol.input_len)
        for batch in protocol.batches:
            gpu_times[(max_model_len, batch)] = gpu_time_per_decode_token(target.llm, [prompt] * batch, steps, top=8)

    rows = benchmark.bench_offline(str(workdir / spec.checkpoint), protocol, args, after_protocol=profile)
    return [{"engine": spec.name, "mode": mode, "output_len": protocol.output_len, **row.metrics(),
             **{f"gpu_us_{family}": 1e6 * gpu_times.get((row.max_model_len, row.batch), {}).get(family, 0.0)
                for family in ("all", *FAMILIES)}} for row in rows]


def offload_model_rows(fp16_rows: list[dict], bandwidth: float, workdir: Path, protocol) -> list[dict]:
    """The seeds' baseline as a MODEL: the measured whole-GPU fp16 rows plus the offloaded bytes at the measured
    PCIe H2D bandwidth per forward (decode: every step; prefill: once)."""
    shape = v100_budget.load_shape(workdir / FP16_DIR)
    offloaded = v100_budget.offloaded_bytes(shape, v100_budget.ENGINES[3], max(protocol.batches),
                                            max(protocol.max_model_lens))
    extra = offloaded / bandwidth
    rows = []
    for row in fp16_rows:
        step = row["batch"] / row["decode_tok_s"]
        ttft = row["ttft_ms_mean"] / 1e3 + extra
        rows.append({**row, "engine": f"MODEL: fp16 + offload ({offloaded / 1e9:.1f} GB over measured "
                     f"{bandwidth / 1e9:.1f} GB/s PCIe)", "decode_tok_s": row["batch"] / (step + extra),
                     "decode_tok_s_per_seq": 1 / (step + extra), "ttft_ms_mean": 1e3 * ttft,
                     "ttft_ms_p50": 1e3 * ttft, "prefill_tok_s": protocol.input_len * row["batch"] / ttft})
    return rows


COLUMNS = ("engine", "mode", "max_model_len", "batch", "output_len", "ttft_ms_mean", "prefill_tok_s", "decode_tok_s",
           "decode_tok_s_per_seq", "gpu_us_all", *(f"gpu_us_{f}" for f in FAMILIES), "measured")
HEADINGS = ("engine", "mode", "max-model-len", "batch", "generated", "TTFT (ms)", "prefill tok/s", "decode tok/s",
            "decode tok/s/seq", "GPU µs/step", *(f"… {f} µs" for f in FAMILIES), "measured (UTC, commit)")


def render(rows: list[dict], meta: dict, out_dir: Path, stem: str, plot: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# The seeds' benchmark at full depth: Qwen3.8-27B shape — {meta['gpu']}", "",
             f"- rendered: {meta['date']} UTC, commit {meta['commit']}, vLLM {meta['vllm']}, torch {meta['torch']}; "
             "the rows come from several calls: each row's last column says when and at which commit it was measured",
             "- model: 64 layers (48 Gated DeltaNet + 16 gated attention), hidden 5120, intermediate 17408, "
             f"vocabulary {meta['vocab']}, random weights; fp16 embeddings and lm_head; written by "
             "`benchmarks/full_depth_e2e.py` (protocol: `volta-fp4 bench --offline`, toolkit/benchmark.py).",
             f"- protocol: {meta['protocol']}; max-model-len of the rows: "
             f"{', '.join(map(str, sorted({row['max_model_len'] for row in rows})))}; GPU µs/step: kernel time per "
             "decode step of the batch (torch profiler, 32 steps), split by kernel family (devkit/gpu_time.py).",
             f"- memory: V100-capped engines get gpu_memory_utilization = 0.9 × 32 GB / {meta['gpu_total_gb']:.0f} "
             "GB; fp16 whole GPU 0.9. Rows named MODEL are computed, not measured.",
             f"- attention: every engine on the plugin's backend (`attention_backend={BACKEND_NAME}`).", "",
             "| " + " | ".join(HEADINGS) + " |", "|---|---|" + "---:|" * (len(HEADINGS) - 2)]
    for row in rows:
        if "commit" in row:  # the call that measured it (rows of several calls share the table)
            row = {**row, "measured": f"{row['measured_at']}, {row['commit']}"}
        lines.append("| " + " | ".join(f"{row.get(c, 0):.1f}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                                       for c in COLUMNS) + " |")
    written = [out_dir / f"{stem}.md"]
    written[0].write_text("\n".join(lines) + "\n")
    if plot and rows:
        written.append(out_dir / f"{stem}.png")
        commits = dict.fromkeys(row["commit"] for row in rows if "commit" in row)
        write_plot(rows, written[-1], f"Qwen3.8-27B shape, {meta['gpu']}, vLLM {meta['vllm']}; rows measured at "
                                      f"{', '.join(commits) or meta['commit']}")
    return written


def write_plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    lengths = sorted({row["max_model_len"] for row in rows})
    figure, axes = pyplot.subplots(1, 2 * len(lengths), figsize=(7 * len(lengths), 4), squeeze=False)
    for index, length in enumerate(lengths):
        for offset, (column, label) in enumerate((("decode_tok_s", "decode tok/s"), ("ttft_ms_mean", "TTFT (ms)"))):
            axis = axes[0][2 * index + offset]
            for engine, mode in dict.fromkeys((r["engine"], r["mode"]) for r in rows):
                series = [r for r in rows if (r["engine"], r["mode"], r["max_model_len"]) == (engine, mode, length)]
                axis.plot([r["batch"] for r in series], [r[column] for r in series], marker="o",
                          label=f"{engine[:40]}, {mode}")
            axis.set_yscale("log")
            axis.set_xlabel("batch")
            axis.set_title(f"{label}, max-model-len {length}", fontsize=9)
            axis.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=6)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def bench(args) -> int:
    import torch
    import vllm

    import vllm_volta_fp4

    for module in args.preload:
        runpy.run_path(module)  # e.g. the kit's stand-in for vLLM's UVA op (scripts/gpu/uva_view_standin.py)
    vllm_volta_fp4.register()
    protocol = benchmark.Protocol(args.input_len, args.output_len, args.batches, args.max_model_lens, args.repeats)
    store = args.workdir / "results.json"
    rows = json.loads(store.read_text()) if store.exists() else []
    cuda = torch.cuda.is_available()
    meta = {"gpu": torch.cuda.get_device_name(0) if cuda else "CPU (dry run)", "commit": args.commit,
            "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}", "vllm": vllm.__version__,
            "torch": torch.__version__, "vocab": json.loads((args.workdir / FP16_DIR / "config.json").read_text())
            ["text_config"]["vocab_size"], "gpu_total_gb": torch.cuda.mem_get_info()[1] / 1e9 if cuda else 0,
            "protocol": f"{protocol.input_len} in / {protocol.output_len} out, batches {protocol.batches}, "
                        f"{protocol.repeats} round(s)"}
    status = 0
    measured = {"measured_at": meta["date"], "commit": args.commit}
    # One engine per (engine, mode, max-model-len), its rows stored as soon as it ends: an engine that fails (at
    # 8192, say) loses no other engine's rows.
    for key, mode, length in itertools.product(args.engines, args.modes, protocol.max_model_lens):
        spec, one_length = ENGINES[key], replace(protocol, max_model_lens=(length,))
        rows = [r for r in rows if (r["engine"], r["mode"], r["max_model_len"]) != (spec.name, mode, length)]
        try:
            rows += [{**row, **measured} for row in run_engine(spec, mode, args.workdir, one_length)]
        except Exception:  # noqa: BLE001 — one engine's failure must not lose the others' rows
            traceback.print_exc()
            status = 1
            fp16 = [r for r in rows if r["engine"] == ENGINES["fp16"].name and r["mode"] == mode
                    and r["max_model_len"] == length]
            if spec.offload and cuda and fp16:
                bandwidth = measure_pcie_h2d()
                print(f"offload engine failed; PCIe H2D measured at {bandwidth / 1e9:.1f} GB/s → MODEL rows",
                      flush=True)
                rows += [{**row, **measured} for row in offload_model_rows(fp16, bandwidth, args.workdir, one_length)]
        store.write_text(json.dumps(rows, indent=1))
        for path in render(rows, meta, args.out_dir, args.stem, plot=not args.no_plot):
            print(f"wrote {path}", flush=True)
    return status


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("checkpoint", "bench"))
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--formats", default="ct-w4a16", help="checkpoint: comma-separated, ct-w4a16,modelopt-mixed")
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=FULL_VOCAB)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--engines", default="w4a16,fp16,fp16-offload", help=f"comma-separated of {list(ENGINES)}")
    parser.add_argument("--modes", default="default,eager")
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--batches", type=_ints, default=(1, 4, 8))
    parser.add_argument("--max-model-lens", type=_ints, default=(4096, 8192))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--preload", action="append", default=[], help="Python files run before any engine")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--stem", help="bench: file name of the table and plot, one per GPU model (rows of one GPU "
                                       "only; scripts/gpu/run_full_depth_gpu.sh names it from the GPU)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.phase == "checkpoint":
        write_checkpoints(args.workdir, args.formats.split(","), args.layers, args.vocab, args.device)
        return 0
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    args.engines = [key for key in args.engines.split(",") if key]
    args.modes = [mode for mode in args.modes.split(",") if mode]
    unknown = [key for key in args.engines if key not in ENGINES] + [m for m in args.modes if m not in MODES]
    if unknown:
        parser.error(f"unknown engine or mode: {unknown}")
    if not args.stem:
        parser.error("bench needs --stem (e.g. full-depth-27b-h100): rows of different GPUs go to different tables")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
