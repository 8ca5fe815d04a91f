#!/usr/bin/env python3
"""vLLM engine throughput with the plugin: a synthetic model with Qwen3.8-27B layer widths (a few decoder layers,
random weights made on the GPU) served as NVFP4 with ``quantization="volta_nvfp4"`` against the same weights
dequantized to fp16 and served unquantized, in one run on one GPU.

``--arch qwen3`` (default): the Qwen3 architecture (full attention only, no output gate); engines fp16 and
volta_nvfp4. ``--arch qwen3_5``: the real hybrid, Qwen3_5ForConditionalGeneration (3 Gated-DeltaNet layers : 1
gated full-attention layer, text only); engines fp16 and volta_nvfp4 on vLLM's Triton GDN kernels, and volta_nvfp4
on this project's GDN kernels (vllm_volta_fp4.plugin.gdn_layer, registered in-process for that engine only).

Measured per engine: decode tok/s at batch 1 and 8 (generation time of N extra tokens over the same prompts with
one token), prefill tok/s and time to first token at 512 and 2048 prompt tokens (batch 1, one prefill step), and
the GPU kernel time per decoded token at batch 1 (torch profiler, the sum of kernel times: what the step would
cost without CPU-side overhead), split by kernel family (KERNEL_FAMILIES), beside the wall-clock per token at
batch 1 (their gap is the host time per step). Medians of repeats; prefix caching off. Every engine runs in vLLM's
default mode (torch.compile + CUDA graphs), or eager with ``--mode eager``, each in its own Python process (the
checkpoints are made once, by the parent).

    python3 benchmarks/throughput_e2e.py --out results.md --commit abc1234 [--arch qwen3_5] [--layers 8] [--mode eager]
        [--engines volta_nvfp4,fp16] [--host-profile DIR]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit.engine import (  # noqa: E402
    engine_model,
    gdn_layers_on_our_kernels,
    use_torch_allocator_for_triton,
)
from devkit.gpu_time import KERNEL_FAMILIES, gpu_time_per_decode_token  # noqa: E402
from devkit.host_time import host_profile  # noqa: E402
from vllm_volta_fp4.testing.greedy import ENGINE_MODES, supported_engine_args  # noqa: E402
from vllm_volta_fp4.testing.tiny_model import HybridArch, TinyArch, make_checkpoint, qwen3_8_27b  # noqa: E402
from vllm_volta_fp4.toolkit.convert import convert_to_dense  # noqa: E402

PREFILL_LENGTHS = (512, 2048)
DECODE_BATCHES = (1, 8)
DECODE_PROMPT = 128
DECODE_TOKENS = 128
REPEATS = 3  # default of --repeats

@dataclass(frozen=True)
class Engine:
    """One column of the table: how the checkpoint is served."""

    name: str
    what: str
    quantized: bool  # the NVFP4 checkpoint with volta_nvfp4, else its fp16 dequantization unquantized
    our_gdn: bool = False  # vllm_volta_fp4's GDN kernels in vLLM's GDN layers, else vLLM's Triton ones


@dataclass(frozen=True)
class Arch:
    """A benchmarked architecture: its shape at ``layers`` layers, the engines, their extra engine arguments,
    the kernel families it runs and how the table describes the model."""

    shape: Callable[[int], TinyArch | HybridArch]
    engines: tuple[Engine, ...]
    engine_args: dict
    kernel_families: tuple[str, ...]
    describe: Callable[[int], str]


def _describe_qwen3(layers: int) -> str:
    return (f"Qwen3 architecture with Qwen3.8-27B widths (hidden 5120, intermediate 17408, 24 Q / 4 KV heads × 256), "
            f"{layers} decoder layers")


def _describe_qwen3_5(layers: int) -> str:
    full = layers // 4
    return (f"Qwen3_5ForConditionalGeneration (the Qwen3.8-27B hybrid) at its widths: {layers} decoder layers = "
            f"{layers - full} Gated-DeltaNet + {full} gated full attention (every 4th, as in the real 64), hidden "
            "5120, MLP intermediate 17408; full attention 24 Q / 4 KV heads × 256 with sigmoid output gate, partial "
            "rotary 0.25; GDN 16 key / 48 value heads × 128, conv kernel 4; a one-block 64-wide vision tower "
            "(served text only: `language_model_only`); weights initialised as transformers does (N(0, 0.02))")


_FP16 = "the fp16 checkpoint served unquantized (cuBLAS GEMMs)"
_NVFP4 = "the NVFP4 checkpoint with `quantization=\"volta_nvfp4\"` (our GEMMs)"
_VLLM_GDN = "vLLM's Triton kernels (`gdn_prefill_backend=\"triton\"`)"

ARCHS = {
    "qwen3": Arch(
        shape=lambda layers: TinyArch("Qwen3ForCausalLM", "qwen3", 5120, 17408, 24, 4, 256, layers, True),
        engines=(Engine("fp16", _FP16, quantized=False), Engine("volta_nvfp4", _NVFP4, quantized=True)),
        engine_args={}, kernel_families=("linear", "attention"), describe=_describe_qwen3),
    "qwen3_5": Arch(
        shape=qwen3_8_27b,
        engines=(Engine("fp16", f"{_FP16}, GDN on {_VLLM_GDN}", quantized=False),
                 Engine("volta_nvfp4", f"{_NVFP4}, GDN on {_VLLM_GDN}", quantized=True),
                 Engine("volta_nvfp4 + our GDN", f"{_NVFP4}, GDN on our kernels (vllm_volta_fp4.plugin.gdn_layer)",
                        quantized=True, our_gdn=True)),
        # With prefix caching off vLLM keeps one GDN state per sequence (mamba_cache_mode "none"), so the step
        # budget need not cover an attention block (which it sizes to hold a GDN state: ~400 tokens at these widths).
        engine_args={"language_model_only": True, "gdn_prefill_backend": "triton"},
        kernel_families=("linear", "GDN", "attention"), describe=_describe_qwen3_5),
}


def timed(llm, prompts: list[list[int]], max_tokens: int, repeats: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    inputs = [{"prompt_token_ids": prompt} for prompt in prompts]
    llm.generate(inputs, params, use_tqdm=False)  # untimed: Triton compiles vLLM's kernels for new shapes here
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(model: Path, arch: Arch, engine: Engine, attention: str, repeats: int, mode: str,
            host_profile_dir: Path | None = None) -> dict[str, float]:
    import torch
    from vllm import LLM

    from vllm_volta_fp4.ops import gdn
    from vllm_volta_fp4.plugin import gdn_layer

    settings = {**ENGINE_MODES[mode], "model": str(model), "dtype": "float16", "max_model_len": 4096,
                "max_num_batched_tokens": 4096, "max_num_seqs": 16, "enable_prefix_caching": False,
                "gpu_memory_utilization": 0.6, "kv_cache_memory_bytes": 4 << 30, "seed": 0,
                "attention_backend": attention, **arch.engine_args}
    if engine.quantized:
        settings["quantization"] = "volta_nvfp4"
    # The overrides stay in this engine's process (measure_in_subprocess); without our GDN ops they would silently
    # defer to vLLM's kernels and the column would be a copy.
    if engine.our_gdn and not (gdn.kernels_available() and gdn_layer.install()):
        raise RuntimeError("vllm_volta_fp4's GDN kernels cannot run here (extension without GDN ops, or no GDN layer "
                           "in this vLLM)")
    llm = LLM(**supported_engine_args(settings))
    generator = torch.Generator().manual_seed(0)

    def prompt(length: int) -> list[int]:
        return torch.randint(5, 380, (length,), generator=generator).tolist()

    results: dict[str, float] = {}
    try:
        if engine.our_gdn:
            layers = gdn_layers_on_our_kernels(engine_model(llm))
            print(f"  GDN layers on our kernels: {layers}", flush=True)
            if layers == 0:
                raise RuntimeError("no GDN layer of the engine runs vllm_volta_fp4's GDN kernels")
        timed(llm, [prompt(64)], 8, repeats=1)  # warm-up: first launches, allocator, Triton compilation
        for length in PREFILL_LENGTHS:
            seconds = timed(llm, [prompt(length)], 1, repeats)
            results[f"TTFT {length} (ms)"] = seconds * 1e3
            results[f"prefill {length} (tok/s)"] = length / seconds
            print(f"  prefill {length}: {seconds * 1e3:.1f} ms", flush=True)
        for batch in DECODE_BATCHES:
            prompts = [prompt(DECODE_PROMPT) for _ in range(batch)]
            seconds = timed(llm, prompts, DECODE_TOKENS + 1, repeats) - timed(llm, prompts, 1, repeats)
            results[f"decode batch {batch} (tok/s)"] = batch * DECODE_TOKENS / seconds
            print(f"  decode batch {batch}: {batch * DECODE_TOKENS / seconds:.1f} tok/s", flush=True)
        gpu_time = gpu_time_per_decode_token(llm, [prompt(DECODE_PROMPT)], DECODE_TOKENS)
        results["GPU time per token, batch 1 (µs)"] = gpu_time["all"] * 1e6
        if host_profile_dir:  # .log: the device call's log archive takes it
            name = "host-profile-" + "".join(c if c.isalnum() else "-" for c in engine.name) + ".log"
            host_profile(llm, [prompt(DECODE_PROMPT)], DECODE_TOKENS, host_profile_dir / name)
        # The host-time goal: at batch 1 a decoded token should take little more wall-clock than GPU time.
        results["wall-clock per token, batch 1 (µs)"] = 1e6 / results["decode batch 1 (tok/s)"]
        for family in arch.kernel_families:
            results[f"… of it in {family} kernels (µs)"] = gpu_time.get(family, 0.0) * 1e6
        print("  GPU time per decoded token: " + ", ".join(f"{family} {seconds * 1e6:.0f} µs"
                                                            for family, seconds in gpu_time.items()), flush=True)
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return results


def ratio(metric: str, base: float, other: float) -> str:
    """How much better ``other`` is than ``base`` (times are inverted)."""
    if base == 0 or other == 0:
        return "–"
    lower_is_better = "ms" in metric or "µs" in metric
    return f"{base / other if lower_is_better else other / base:.2f}×"


def measure_in_subprocess(model: Path, engine: Engine, args: argparse.Namespace) -> dict[str, float]:
    """``measure`` in a fresh Python process: an engine's leftovers in a process (its threads, caches, compiled
    graphs) slowed the host loop of the engine started after it, and at a few layers that loop is the wall clock."""
    with tempfile.TemporaryDirectory(prefix="throughput-engine-") as scratch:
        result = Path(scratch) / "result.json"
        command = [sys.executable, __file__, "--measure-engine", engine.name, "--model", str(model), "--result",
                   str(result), "--arch", args.arch, "--repeats", str(args.repeats), "--attention", args.attention,
                   "--mode", args.mode] + (["--host-profile", str(args.host_profile)] if args.host_profile else [])
        returncode = subprocess.run(command).returncode
        if returncode != 0:
            raise RuntimeError(f"the {engine.name} engine's process failed (exit {returncode}); its log is above")
        return json.loads(result.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="qwen3")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed runs per measurement (median)")
    parser.add_argument("--attention", default="CUSTOM", help="attention backend for every engine")
    parser.add_argument("--mode", choices=sorted(ENGINE_MODES), default="default",
                        help="vLLM's default mode (torch.compile + CUDA graphs) or eager, for every engine")
    parser.add_argument("--workdir", default=None, help="where the checkpoints go (default: a temporary folder)")
    parser.add_argument("--engines", default=None,
                        help="comma-separated engine names in the order to run them (default: all, as listed)")
    parser.add_argument("--host-profile", type=Path, metavar="DIR",
                        help="also write each engine's Python profile of one batch-1 generate there (devkit.host_time)")
    # one engine's process (measure_in_subprocess)
    parser.add_argument("--measure-engine", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    arch = ARCHS[args.arch]
    engines = {engine.name: engine for engine in arch.engines}
    order = args.engines.split(",") if args.engines else list(engines)
    if any(name not in engines for name in order) or len(set(order)) != len(order):
        parser.error(f"--engines: each of {list(engines)} at most once, got {order}")
    if not (args.out or args.measure_engine):
        parser.error("--out is required")
    # in-process engine core: the GDN overrides are registered in this process, and engine_model looks inside
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_VOLTA_FP4_GDN"] = "0"  # our GDN kernels only where an engine asks (Engine.our_gdn)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    import torch
    import triton
    import vllm

    import vllm_volta_fp4

    if args.measure_engine:
        use_torch_allocator_for_triton()  # vLLM 0.20.2 installs none for Qwen3.5
        vllm_volta_fp4.register()
        print(f"{args.measure_engine}:", flush=True)
        results = measure(args.model, arch, engines[args.measure_engine], args.attention, args.repeats, args.mode,
                          args.host_profile)
        args.result.write_text(json.dumps(results))
        return 0

    root = Path(args.workdir or tempfile.mkdtemp(prefix="throughput-"))
    start = time.perf_counter()
    print(f"making a {args.layers}-layer {args.arch} NVFP4 checkpoint at Qwen3.8-27B widths on the GPU …", flush=True)
    quantized = make_checkpoint(root / "nvfp4", arch.shape(args.layers), "ct-w4a16", device="cuda")
    torch.cuda.empty_cache()
    print(f"dequantizing it to fp16 … ({time.perf_counter() - start:.0f} s so far)", flush=True)
    dense = convert_to_dense(quantized, root / "fp16", dtype=torch.float16, verify=False, device="cuda")
    torch.cuda.empty_cache()
    print(f"checkpoints ready in {time.perf_counter() - start:.0f} s", flush=True)

    if args.host_profile:
        args.host_profile.mkdir(parents=True, exist_ok=True)
    columns = {name: measure_in_subprocess(quantized if engines[name].quantized else dense, engines[name], args)
               for name in order}

    size = {name: sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e9
            for name, path in (("fp16", dense), ("volta_nvfp4", quantized))}
    names = [name for name in engines if name in columns]  # the table's order, whatever order they ran in
    pairs = [(base, other) for index, base in enumerate(names) for other in names[index + 1:]]
    lines = [
        f"# vLLM throughput with the plugin, {args.arch} — {torch.cuda.get_device_name(0)}",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {args.commit}, "
        f"vLLM {vllm.__version__}, torch {torch.__version__}, triton {triton.__version__}",
        f"- model: {arch.describe(args.layers)}; vocabulary 384 (so the layers, not the lm_head, dominate), random "
        f"weights. NVFP4 as compressed-tensors W4A16 ({size['volta_nvfp4']:.2f} GB; what real exports leave in 16 "
        f"bits stays so) vs the same weights dequantized to fp16 ({size['fp16']:.2f} GB).",
        "- engines (columns): " + "; ".join(f"**{name}**: {engines[name].what}" for name in names)
        + f"; each in its own process, in the order {', '.join(order)}.",
        f"- engine settings: fp16, attention backend {args.attention} for all, "
        + ("vLLM's default mode (torch.compile + CUDA graphs" if args.mode == "default" else "eager (no CUDA graphs")
        + "; vLLM's native custom ops: its pure-Python kit), prefix caching off, one prefill step "
        f"per prompt; medians of {args.repeats}. Decode: {DECODE_TOKENS} tokens after a {DECODE_PROMPT}-token prompt.",
        "- GPU time per token: the sum of kernel times per decoded token at batch 1 (torch profiler), and the part "
        "of it in each kernel family: " + "; ".join(f"{family} = names matching `{KERNEL_FAMILIES[family].pattern}`"
                                                      for family in arch.kernel_families)
        + "; PyTorch's own kernels (elementwise, copies: vLLM's native ops, e.g. its gated RMSNorm) count in none.",
        "",
        "| metric | " + " | ".join(names) + " | " + " | ".join(f"{other} / {base}" for base, other in pairs) + " |",
        "|---|" + "---:|" * (len(names) + len(pairs)),
    ]
    for metric in columns[names[0]]:
        values = [columns[name][metric] for name in names]
        ratios = [ratio(metric, columns[base][metric], columns[other][metric]) for base, other in pairs]
        lines.append(f"| {metric} | " + " | ".join(f"{value:.1f}" for value in values) + " | " + " | ".join(ratios)
                     + " |")
    lines.append("")
    lines.append("Ratios: higher is better for the engine named first (times are inverted).")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
