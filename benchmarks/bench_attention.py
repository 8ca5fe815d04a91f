#!/usr/bin/env python3
"""Paged attention (our kernels, both MMA atoms) vs torch SDPA's FlashAttention on the same GPU.

Prefill: one causal sequence, no cached prefix. Decode: a batch of single-token queries over equal contexts.
Shapes: Qwen3.8-27B full attention (24 q / 4 kv heads, head_dim 256) and a Llama-like 32 / 8 × 128. SDPA gets
dense contiguous [B, H, S, D] tensors with enable_gqa (it does not read a paged cache); ours reads a paged
cache with 16-token blocks in random order. Outputs are checked against SDPA before timing; times are CUDA-event
medians of repeated calls after warm-up. Prints and writes a markdown table.

    python benchmarks/bench_attention.py --out benchmarks/results/attention-h200.md [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import math

import torch
import torch.nn.functional as F
from event_timing import median_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

from devkit.random_batches import RandomPagedBatch
from vllm_volta_fp4.ops import attention

# (name, num_heads, num_kv_heads, head_size)
MODELS = [("qwen3.8-27b", 24, 4, 256), ("llama-like", 32, 8, 128)]
PREFILL_LENGTHS = [1024, 4096]
DECODE_CASES = [(1, 4096), (16, 4096), (64, 1024)]  # (batch, context)
BLOCK_SIZE = 16


def run_case(kind: str, model: tuple, batch_size: int, length: int, repeats: int) -> dict:
    name, heads, kv_heads, head_size = model
    seqs = [(0, length)] if kind == "prefill" else [(length - 1, 1)] * batch_size
    batch = RandomPagedBatch(seqs, heads, kv_heads, head_size, BLOCK_SIZE, device="cuda", seed=length)
    batch.write_new_tokens()
    scale = 1.0 / math.sqrt(head_size)
    q_len = length if kind == "prefill" else 1
    q = batch.query.view(batch_size, q_len, heads, head_size).transpose(1, 2).contiguous()
    k = torch.stack(batch.keys).cuda().transpose(1, 2).contiguous()
    v = torch.stack(batch.values).cuda().transpose(1, 2).contiguous()

    def sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=kind == "prefill", scale=scale, enable_gqa=True)

    reference = sdpa().transpose(1, 2).reshape(-1, heads, head_size).float()
    row = {"case": f"{kind} {name} " + (f"S={length}" if kind == "prefill" else f"B={batch_size} ctx={length}")}
    row["sdpa_ms"] = median_ms(sdpa, repeats)
    for mma in (80, 70):
        out = torch.full_like(batch.query, float("nan"))

        def ours(out=out, mma=mma):
            attention.paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                                      batch.seq_lens, batch.max_seq_len, scale, out=out, mma=mma)

        ours()
        torch.cuda.synchronize()
        rel = float((out.float() - reference).norm() / reference.norm())
        assert rel < 2e-3 and not out.isnan().any(), f"{row['case']} sm{mma}: rel error {rel}"
        row[f"sm{mma}_ms"] = median_ms(ours, repeats)
    if kind == "prefill":
        flops = 4 * heads * head_size * length * (length + 1) / 2
        row["work"] = f"{flops / row['sm80_ms'] / 1e9:.0f} TFLOP/s (SDPA {flops / row['sdpa_ms'] / 1e9:.0f})"
    else:
        kv_bytes = 2 * batch_size * length * kv_heads * head_size * 2
        row["work"] = f"{kv_bytes / row['sm80_ms'] / 1e6:.0f} GB/s (SDPA {kv_bytes / row['sdpa_ms'] / 1e6:.0f})"
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 20
    rows = []
    for model in MODELS:
        for length in PREFILL_LENGTHS:
            rows.append(run_case("prefill", model, 1, length, repeats))
        for batch_size, context in DECODE_CASES:
            rows.append(run_case("decode", model, batch_size, context, repeats))
    lines = [
        f"# Paged attention vs torch SDPA (FlashAttention) — {torch.cuda.get_device_name()}",
        "",
        f"{datetime.date.today()}, commit {args.commit}, torch {torch.__version__}. fp16; our kernels read a paged "
        f"cache ({BLOCK_SIZE}-token blocks, random order), SDPA dense tensors (enable_gqa). Medians of {repeats} "
        "event-timed calls. ratio = our time / SDPA time (lower is better; 1.0 = parity).",
        "",
        "| case | SDPA flash ms | ours SM80 atom ms | ratio | ours SM70 atom ms | ratio | ours SM80 throughput |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['sdpa_ms']:.3f} | {r['sm80_ms']:.3f} | {r['sm80_ms'] / r['sdpa_ms']:.2f} | "
                     f"{r['sm70_ms']:.3f} | {r['sm70_ms'] / r['sdpa_ms']:.2f} | {r['work']} |")
    table = "\n".join(lines) + "\n"
    print(table)
    with open(args.out, "w") as handle:
        handle.write(table)


if __name__ == "__main__":
    main()
