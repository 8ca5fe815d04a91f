#!/usr/bin/env python3
"""vLLM engine throughput with the plugin: a synthetic model with Qwen3.8-27B layer widths (a few decoder layers,
random weights made on the GPU) served as NVFP4 with ``quantization="volta_nvfp4"`` against the same weights
dequantized to fp16 and served unquantized, in one run on one GPU.

Measured per model: decode tok/s at batch 1 and 8 (generation time of N extra tokens over the same prompts with
one token), prefill tok/s and time to first token at 512 and 2048 prompt tokens (batch 1, one prefill step), and
the GPU kernel time per decoded token at batch 1 (torch profiler, the sum of kernel times: what the step would
cost without CPU-side overhead, e.g. with CUDA graphs), and the part of it spent in the linear layers' GEMM kernels
(ours or cuBLAS's). Medians of repeats; prefix caching off.

    python3 benchmarks/throughput_e2e.py --out results.md --commit abc1234 [--layers 8] [--attention CUSTOM]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_volta_fp4.convert import convert_to_dense  # noqa: E402
from vllm_volta_fp4.greedy import WITHOUT_VLLM_KERNELS, supported_engine_args  # noqa: E402
from vllm_volta_fp4.tiny_model import TinyArch, make_checkpoint  # noqa: E402

PREFILL_LENGTHS = (512, 2048)
DECODE_BATCHES = (1, 8)
DECODE_PROMPT = 128
DECODE_TOKENS = 128
REPEATS = 3


def qwen3_8_27b_layers(layers: int) -> TinyArch:
    """Qwen3.8-27B's widths (hidden 5120, intermediate 17408, 24 query / 4 KV heads of 256) on the Qwen3
    architecture: its full-attention layers without the output gate; no Gated-DeltaNet layers."""
    return TinyArch("Qwen3ForCausalLM", "qwen3", 5120, 17408, 24, 4, 256, layers, True)


def timed(llm, prompts: list[list[int]], max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    inputs = [{"prompt_token_ids": prompt} for prompt in prompts]
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


LINEAR_KERNEL = re.compile(r"gemm|gemv|nvjet|xmma|cutlass", re.IGNORECASE)  # ours and cuBLAS's GEMM kernels


def gpu_time_per_decode_token(llm, prompt: list[int]) -> tuple[float, float]:
    """(all kernels, linear-layer kernels only) in seconds of GPU time per decoded token at batch 1: profiled
    N + 1 tokens minus 1 token. Prints the kernels that take the most time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import SamplingParams

    def kernel_seconds(max_tokens: int) -> dict[str, float]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            torch.cuda.synchronize()
        return {event.key: event.self_device_time_total / 1e6 for event in prof.key_averages()}

    one, many = kernel_seconds(1), kernel_seconds(DECODE_TOKENS + 1)
    per_token = {name: (seconds - one.get(name, 0.0)) / DECODE_TOKENS for name, seconds in many.items()}
    for name, seconds in sorted(per_token.items(), key=lambda item: -item[1])[:12]:
        print(f"    {seconds * 1e6:8.1f} µs/token  {name[:110]}", flush=True)
    linear = sum(seconds for name, seconds in per_token.items() if LINEAR_KERNEL.search(name))
    return sum(per_token.values()), linear


def measure(model: Path, attention: str, quantized: bool) -> dict[str, float]:
    import torch
    from vllm import LLM

    settings = {**WITHOUT_VLLM_KERNELS, "model": str(model), "dtype": "float16", "max_model_len": 4096,
                "max_num_batched_tokens": 4096, "max_num_seqs": 16, "enable_prefix_caching": False,
                "gpu_memory_utilization": 0.6, "kv_cache_memory_bytes": 4 << 30, "seed": 0,
                "attention_backend": attention, "async_scheduling": False}
    if quantized:
        settings["quantization"] = "volta_nvfp4"
    llm = LLM(**supported_engine_args(settings))
    generator = torch.Generator().manual_seed(0)

    def prompt(length: int) -> list[int]:
        return torch.randint(5, 380, (length,), generator=generator).tolist()

    results: dict[str, float] = {}
    try:
        timed(llm, [prompt(64)], 8)  # warm-up: first launches, allocator
        for length in PREFILL_LENGTHS:
            seconds = timed(llm, [prompt(length)], 1)
            results[f"TTFT {length} (ms)"] = seconds * 1e3
            results[f"prefill {length} (tok/s)"] = length / seconds
            print(f"  prefill {length}: {seconds * 1e3:.1f} ms", flush=True)
        for batch in DECODE_BATCHES:
            prompts = [prompt(DECODE_PROMPT) for _ in range(batch)]
            seconds = timed(llm, prompts, DECODE_TOKENS + 1) - timed(llm, prompts, 1)
            results[f"decode batch {batch} (tok/s)"] = batch * DECODE_TOKENS / seconds
            print(f"  decode batch {batch}: {batch * DECODE_TOKENS / seconds:.1f} tok/s", flush=True)
        every_kernel, linear = gpu_time_per_decode_token(llm, prompt(DECODE_PROMPT))
        results["GPU time per token, batch 1 (µs)"] = every_kernel * 1e6
        results["… of it in linear layers (µs)"] = linear * 1e6
        print(f"  GPU time per decoded token: {every_kernel * 1e6:.0f} µs, linear layers {linear * 1e6:.0f} µs",
              flush=True)
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--attention", default="CUSTOM", help="attention backend for both models")
    parser.add_argument("--workdir", default=None, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    import torch
    import vllm

    import vllm_volta_fp4

    vllm_volta_fp4.register()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="throughput-"))
    shape = qwen3_8_27b_layers(args.layers)
    start = time.perf_counter()
    print(f"making a {args.layers}-layer Qwen3.8-27B-width NVFP4 checkpoint on the GPU …", flush=True)
    quantized = make_checkpoint(root / "nvfp4", shape, "ct-w4a16", device="cuda")
    print(f"dequantizing it to fp16 … ({time.perf_counter() - start:.0f} s so far)", flush=True)
    dense = convert_to_dense(quantized, root / "fp16", dtype=torch.float16, verify=False, device="cuda")
    print(f"checkpoints ready in {time.perf_counter() - start:.0f} s", flush=True)

    columns = {}
    for name, model, is_quantized in (("fp16", dense, False), ("volta_nvfp4", quantized, True)):
        print(f"{name}:", flush=True)
        columns[name] = measure(model, args.attention, is_quantized)

    size = {name: sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e9
            for name, path in (("fp16", dense), ("volta_nvfp4", quantized))}
    lines = [
        f"# vLLM throughput with the plugin — {torch.cuda.get_device_name(0)}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {args.commit}, "
        f"vLLM {vllm.__version__}, torch {torch.__version__}",
        f"- model: Qwen3 architecture with Qwen3.8-27B widths (hidden 5120, intermediate 17408, 24 Q / 4 KV heads "
        f"× 256), {args.layers} decoder layers, vocabulary 384 (so the layers, not the lm_head, dominate), random "
        f"weights; NVFP4 as compressed-tensors W4A16 ({size['volta_nvfp4']:.2f} GB) vs the same weights "
        f"dequantized to fp16 ({size['fp16']:.2f} GB) and served unquantized (cuBLAS).",
        f"- engine: fp16, attention backend {args.attention} for both, eager (no CUDA graphs: "
        "`benchmarks/throughput_e2e.py` runs with vLLM's pure-Python kit), prefix caching off, one prefill step "
        f"per prompt; medians of {REPEATS}. Decode: {DECODE_TOKENS} tokens after a {DECODE_PROMPT}-token prompt.",
        "",
        "| metric | fp16 | volta_nvfp4 | volta_nvfp4 / fp16 |",
        "|---|---:|---:|---:|",
    ]
    for metric in columns["fp16"]:
        fp16, ours = columns["fp16"][metric], columns["volta_nvfp4"][metric]
        lower_is_better = "ms" in metric or "µs" in metric
        ratio = fp16 / ours if lower_is_better else ours / fp16
        lines.append(f"| {metric} | {fp16:.1f} | {ours:.1f} | {ratio:.2f}× |")
    lines.append("")
    lines.append("Ratios: higher is better for the plugin (times are inverted).")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
