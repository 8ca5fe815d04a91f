"""GPU kernel time per decoded token of a vLLM engine, split by kernel family (torch profiler), shared by
benchmarks/throughput_e2e.py and benchmarks/full_depth_e2e.py."""

from __future__ import annotations

import re

# Kernel families of the GPU-time split; a kernel counts in the first family whose pattern its name matches.
KERNEL_FAMILIES = {
    # ours (weight_gemm / weight_gemv / dequantize_tiles) and cuBLAS's GEMM kernels
    "linear": re.compile(r"gemm|gemv|dequantize_tiles|nvjet|xmma|cutlass", re.IGNORECASE),
    # ours (namespace volta_fp4::gdn); vLLM's Triton kernels: FLA's chunked rule (chunk_*, solve_tril, merge_16x16,
    # recompute_w_u, l2norm), recurrent decode (fused_recurrent_*, fused_sigmoid_gating_*), fused_gdn_gating,
    # _fused_post_conv, mamba's _causal_conv1d_* and the gated RMSNorm (layer_norm_fwd*: RMSNormGated's CUDA path)
    "GDN": re.compile(r"gdn|chunk|recurrent|conv1d|sigmoid_gating|post_conv|solve_tril|merge_16x16|recompute_w_u"
                      r"|l2norm|layer_norm_fwd", re.IGNORECASE),
    # ours (namespace volta_fp4::attention: paged attention, split combine, KV-cache write)
    "attention": re.compile(r"attention", re.IGNORECASE),
}
# The families as the tables list them ("other": every kernel no pattern matches).
FAMILIES = ("linear", "attention", "GDN", "other")


def kernel_family(name: str) -> str:
    return next((family for family, pattern in KERNEL_FAMILIES.items() if pattern.search(name)), "other")


def gpu_time_per_decode_token(llm, prompts: list[list[int]], decode_tokens: int, top: int = 16
                              ) -> dict[str, float]:
    """Seconds of GPU time per decode step of the batch ``prompts``, all kernels ("all") and per kernel family:
    profiled ``decode_tokens`` + 1 tokens minus 1 token, over ``decode_tokens``. Prints the ``top`` kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vllm_volta_fp4.testing.greedy import generate_greedy

    # a CPU engine (dry runs) has no CUDA activity: its CPU ops are profiled instead, so the code path still runs
    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU

    def kernel_seconds(max_tokens: int) -> dict[str, float]:
        with profile(activities=[activity]) as prof:
            generate_greedy(llm, prompts, max_tokens)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        return {event.key: (event.self_device_time_total if activity == ProfilerActivity.CUDA
                            else event.self_cpu_time_total) / 1e6 for event in prof.key_averages()}

    one, many = kernel_seconds(1), kernel_seconds(decode_tokens + 1)
    per_token = {name: (seconds - one.get(name, 0.0)) / decode_tokens for name, seconds in many.items()}
    for name, seconds in sorted(per_token.items(), key=lambda item: -item[1])[:top]:
        print(f"    {seconds * 1e6:8.1f} µs/token  {kernel_family(name):13}  {name[:110]}", flush=True)
    totals = {"all": sum(per_token.values())}
    for name, seconds in per_token.items():
        totals[kernel_family(name)] = totals.get(kernel_family(name), 0.0) + seconds
    return totals
