#!/usr/bin/env python3
"""Dequantize + cuBLAS against the size of its fp16 chunk (VLLM_VOLTA_FP4_DEQUANT_CHUNK_MIB), beside cuBLAS FP16,
on the Qwen3.8-27B shapes at the M that path serves; one run on one GPU, timed as bench_gemm.py times.

    python benchmarks/bench_dequant_chunk.py --out benchmarks/results/dequant-chunk-h200.md [--mib 0,8,32,128]
(0: the extension's default, 128 MiB.)
"""

from __future__ import annotations

import argparse

import torch
from bench_gemm import SHAPES, git_commit, m_cases, parse_args, rotated_weights, time_graph

from vllm_volta_fp4.ops import linear

M_VALUES = [128, 256, 512, 1024, 2048, 4096, 8192]


def bench_shape(name: str, n: int, k: int, chunk_mib: list[int]) -> list[str]:
    device = torch.device("cuda")
    w16, _, prepared_copies, w16_copies = rotated_weights(n, k, device)
    nvfp4_copies, fp16_copies = len(prepared_copies), len(w16_copies)
    lines = []
    for m, inputs, reference, calls in m_cases(w16, M_VALUES):

        def cublas_fp16(i, inputs=inputs):
            return torch.nn.functional.linear(inputs[i % len(inputs)], w16_copies[i % fp16_copies])

        def step(i, inputs=inputs):
            return linear.nvfp4_linear(inputs[i % len(inputs)], prepared_copies[i % nvfp4_copies],
                                       path=linear.PATH_DEQUANT_CUBLAS)

        cublas = time_graph(cublas_fp16, fp16_copies, calls)
        cells = []
        for mib in chunk_mib:
            torch.ops.volta_fp4.configure_gemm(-1, -1, mib if mib > 0 else -1)
            error = ((step(0).float() - reference).norm() / reference.norm()).item()
            if not error < 2e-3:
                raise AssertionError(f"{name} M={m} chunk {mib} MiB: relative error {error:.2e}")
            us = time_graph(step, nvfp4_copies, calls)
            cells.append(f"{us:.1f} ({cublas / us:.2f})")
        linear.configure_from_environment()
        lines.append(f"| {name} | {n} | {k} | {m} | {cublas:.1f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="0,8,32,128", help="chunk sizes in MiB, comma-separated (0: default)")
    args = parse_args(parser)
    chunk_mib = [int(v) for v in args.mib.split(",")]
    l2_mib = torch.cuda.get_device_properties(0).L2_cache_size / 2**20
    head = [f"# Dequantize + cuBLAS by fp16 chunk size — {torch.cuda.get_device_name()}", "",
            f"- commit: {args.commit or git_commit()}; L2 {l2_mib:.0f} MiB; torch {torch.__version__}",
            "- µs per call (× cuBLAS FP16 of the same run), medians of CUDA-graph replays, weights rotated beyond L2.",
            "", "| shape | N | K | M | cuBLAS fp16 µs | " + " | ".join(
                f"{mib} MiB" if mib > 0 else "default" for mib in chunk_mib) + " |",
            "|---|---:|---:|---:|---:|" + "---:|" * len(chunk_mib)]
    print("\n".join(head), flush=True)
    shapes = [s for s in SHAPES if s[0] in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")]
    body = [line for name, n, k in shapes for line in bench_shape(name, n, k, chunk_mib)]
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(head + body) + "\n")


if __name__ == "__main__":
    main()
