#!/usr/bin/env python3
"""NVFP4 GEMM (fused, GEMV, dequantize + cuBLAS) vs cuBLAS FP16 on Qwen3.8-27B linear shapes, in one run on one GPU.

Each variant is timed as a CUDA graph of R back-to-back calls (so launch gaps are the GPU's, not Python's),
rotating over weight copies and inputs that together exceed L2 several times; median of the replays. Results are
checked against the dequantized weight before timing. Prints and writes a markdown table.

    python benchmarks/bench_gemm.py --out benchmarks/results/gemm-h200.md [--quick] [--m 16 32 64 128]
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import subprocess

import torch

from vllm_volta_fp4.format.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from vllm_volta_fp4.ops import linear

# (name, N, K). Qwen3.8-27B: hidden 5120, intermediate 17408, 24 q heads × 256 doubled by the output gate
# (12288) + k/v 2 × 4 × 256; Gated-DeltaNet in_proj taken as 5120 → 16384, out_proj 6144 → 5120.
SHAPES = [
    ("qkv_proj", 12288 + 2048, 5120),
    ("o_proj", 5120, 6144),
    ("gate_up_proj", 2 * 17408, 5120),
    ("down_proj", 5120, 17408),
    ("gdn_in_proj", 16384, 5120),
    ("gdn_out_proj", 5120, 6144),
]
M_VALUES = [1, 2, 4, 8, 12, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ROTATION_BYTES = 512 << 20  # > 8 × the H200's L2
GEMV_MAX_M = 16  # PATH_GEMV takes M <= 16 (kGemvMaxM in csrc/gemm/weight_gemm_shape.h)


def time_graph(step, rotations: int, calls: int, replays: int = 7) -> float:
    """Median µs per call of `step(i)` captured `calls` times (i rotating) in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            step(i % rotations)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            step(i % rotations)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy, GB/s counting bytes read + written."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    time_graph(lambda i: b.copy_(a), 1, 50)  # let the clocks come up
    us = time_graph(lambda i: b.copy_(a), 1, 20)
    return 2 * a.numel() / us / 1e3


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
        return commit + (" + uncommitted changes" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "uncommitted (no git history)"


def rotated_weights(n: int, k: int, device: torch.device):
    """A random NVFP4 weight: (its fp16 dequantization, packed bytes, prepared copies, fp16 copies), each list of
    copies large enough together to rotate beyond L2."""
    q = quantize_nvfp4(torch.randn(n, k, device=device) * 0.02)
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale.expand(n).contiguous())
    w16 = dequantize_nvfp4(q.packed, q.block_scale, q.global_scale, torch.float16)
    packed_bytes = n * k // 2 + n * k // 16
    nvfp4_copies = max(2, math.ceil(ROTATION_BYTES / packed_bytes))
    fp16_copies = max(2, math.ceil(ROTATION_BYTES / w16.numel() / 2))
    prepared_copies = [prepared] + [{key: t.clone() for key, t in prepared.items()} for _ in range(nvfp4_copies - 1)]
    return w16, packed_bytes, prepared_copies, [w16] + [w16.clone() for _ in range(fp16_copies - 1)]


def m_cases(w16: torch.Tensor, m_values: list[int]):
    """For each M: (M, inputs to rotate over, the first one's float32 reference output, calls per CUDA graph)."""
    k = w16.shape[1]
    for m in m_values:
        inputs = [torch.randn(m, k, device=w16.device).half()
                  for _ in range(max(2, min(8, ROTATION_BYTES // (m * k * 2))))]
        yield m, inputs, inputs[0].float() @ w16.float().T, 20 if m <= 256 else 3


def bench_shape(name: str, n: int, k: int, m_values: list[int], copy_gbps: float) -> list[dict]:
    device = torch.device("cuda")
    w16, packed_bytes, prepared_copies, w16_copies = rotated_weights(n, k, device)
    nvfp4_copies, fp16_copies = len(prepared_copies), len(w16_copies)
    rows = []
    for m, inputs, reference, calls in m_cases(w16, m_values):
        def nvfp4(path, mma=None, inputs=inputs):
            return lambda i: linear.nvfp4_linear(inputs[i % len(inputs)], prepared_copies[i % nvfp4_copies], mma=mma,
                                                 path=path)

        def cublas_fp16(i, inputs=inputs):
            return torch.nn.functional.linear(inputs[i % len(inputs)], w16_copies[i % fp16_copies])

        variants = {
            "cublas_fp16": (cublas_fp16, fp16_copies),
            "fused_sm80": (nvfp4(linear.PATH_FUSED, 80), nvfp4_copies),
            "dequant_cublas": (nvfp4(linear.PATH_DEQUANT_CUBLAS), nvfp4_copies),
            "auto": (nvfp4(linear.PATH_AUTO), nvfp4_copies),
        }
        if m <= 64:
            variants["fused_sm70"] = (nvfp4(linear.PATH_FUSED, 70), nvfp4_copies)
        if m <= GEMV_MAX_M:
            variants["gemv"] = (nvfp4(linear.PATH_GEMV), nvfp4_copies)
        row = {"shape": name, "N": n, "K": k, "M": m}
        for variant, (step, rotations) in variants.items():
            out = step(0).float()
            error = ((out - reference).norm() / reference.norm()).item()
            if not error < 2e-3:
                raise AssertionError(f"{name} M={m} {variant}: relative error {error:.2e}")
            row[variant] = time_graph(step, rotations, calls)
        best = row["auto"]
        row["speedup_vs_cublas"] = row["cublas_fp16"] / best
        row["fused_speedup_vs_cublas"] = row["cublas_fp16"] / row["fused_sm80"]
        row["fused_packed_gbps"] = packed_bytes / row["fused_sm80"] / 1e3
        row["fused_pct_of_copy"] = 100 * row["fused_packed_gbps"] / copy_gbps
        row["auto_tflops"] = 2 * m * n * k / best / 1e6
        if "gemv" in row:
            row["gemv_speedup_vs_cublas"] = row["cublas_fp16"] / row["gemv"]
            row["gemv_pct_of_copy"] = 100 * packed_bytes / row["gemv"] / 1e3 / copy_gbps
        rows.append(row)
        print(" ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in row.items()), flush=True)
        del inputs, variants  # the closures hold the inputs too
    return rows


def markdown(rows: list[dict], copy_gbps: float, gpu: str, commit: str) -> str:
    lines = [
        f"# NVFP4 GEMM benchmark — {gpu}",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        f"- commit: {commit}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}; device-to-device copy: {copy_gbps:.0f} GB/s (read + write)",
        "- times: µs per call, median of CUDA-graph replays, weights/inputs rotated over > 512 MB (beyond L2).",
        "- `fused_sm80` / `fused_sm70`: the fused kernel with the m16n8k16 / m8n8k4 atom (sm70 on Hopper runs in a",
        "  compatibility mode: a correctness run, not a Volta number). `dequant_cublas`: tile-wise dequantize to fp16 +",
        "  cuBLAS. `auto`: what the op dispatches to. Speedups are cuBLAS FP16 time / ours (higher is better).",
        "- GB/s: packed weight bytes (codes + block scales) / fused time; % of copy: that over the copy bandwidth.",
        "- `gemv`: the GEMV (PATH_GEMV, M <= 16, weights decoded into MMA fragments); `gemv × cuBLAS` and `gemv % copy` as for the fused kernel.",
        "",
        "| shape | N | K | M | cuBLAS fp16 µs | fused sm80 µs | fused sm70 µs | gemv µs | dequant+cuBLAS µs | auto µs | auto × cuBLAS | fused × cuBLAS | gemv × cuBLAS | fused GB/s | % copy | gemv % copy | auto TFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sm70 = f"{r['fused_sm70']:.1f}" if "fused_sm70" in r else "–"
        gemv, gemv_speedup, gemv_pct = (
            (f"{r['gemv']:.1f}", f"{r['gemv_speedup_vs_cublas']:.2f}", f"{r['gemv_pct_of_copy']:.0f}") if "gemv" in r else ("–",) * 3
        )
        lines.append(
            f"| {r['shape']} | {r['N']} | {r['K']} | {r['M']} | {r['cublas_fp16']:.1f} | {r['fused_sm80']:.1f} | {sm70} | {gemv} | "
            f"{r['dequant_cublas']:.1f} | {r['auto']:.1f} | {r['speedup_vs_cublas']:.2f} | {r['fused_speedup_vs_cublas']:.2f} | "
            f"{gemv_speedup} | {r['fused_packed_gbps']:.0f} | {r['fused_pct_of_copy']:.0f} | {gemv_pct} | {r['auto_tflops']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """A GEMM benchmark's arguments with --out and --commit added; stops without CUDA and the extension."""
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--commit", default=None, help="commit to record (default: git rev-parse)")
    args = parser.parse_args()
    if not linear.is_available():
        raise SystemExit("needs CUDA and the built vllm_volta_fp4._C")
    torch.manual_seed(0)
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, fewer M")
    parser.add_argument("--m", type=int, nargs="+", help="these M values only (all shapes)")
    args = parse_args(parser)
    copy_gbps = copy_bandwidth()
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s", flush=True)
    shapes = SHAPES[:2] if args.quick else SHAPES
    m_values = args.m or ([1, 4, 8, 64, 2048] if args.quick else M_VALUES)
    rows = [row for name, n, k in shapes for row in bench_shape(name, n, k, m_values, copy_gbps)]
    table = markdown(rows, copy_gbps, torch.cuda.get_device_name(), args.commit or git_commit())
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
