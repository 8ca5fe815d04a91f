#!/usr/bin/env python3
"""Paged attention (our kernels, both MMA atoms) vs torch SDPA's FlashAttention on the same GPU.

Prefill: one causal sequence, no cached prefix. Decode: a batch of single-token queries over equal contexts.
Shapes: Qwen3.8-27B full attention (24 q / 4 kv heads, head_dim 256) and a Llama-like 32 / 8 × 128. SDPA gets
dense contiguous [B, H, S, D] tensors with enable_gqa (it does not read a paged cache); ours reads a paged
cache with 16-token blocks in random order. Outputs are checked against SDPA before timing; times are CUDA-event
medians of repeated calls after warm-up. Prints and writes a markdown table.

``--short-decode``: decode calls of 1 key to 32 KV tiles at batch 1 and 16 by forced split count (where a short
call's time goes: a tile against a key, a second tile in the split against a second split and its merge).

``--decode-sweep``: decode alone (issue #17's table), SM80 atom, head_dim 64/128/256 at GQA 6:1 and 8:1, batch
1…64, context 128…32768, GPU time per call (launch hidden, as under CUDA graphs) with the kernel's own split count
— for ``max_seq_len`` = the context (eager) and = the longest context (what a FULL CUDA graph passes: the engine's
max_model_len) — and with every forced split count, the best of which is reported; the share of the KV bytes'
time against a device copy measured in the same run. The cache is random on the GPU (no dense copy), each case's
outputs are NaN-free and agree across split counts, and each shape's outputs are checked against SDPA once.

    python benchmarks/bench_attention.py --out benchmarks/results/attention-h200.md [--quick]
    python benchmarks/bench_attention.py --decode-sweep --out benchmarks/results/attention-decode-h200.md
    python benchmarks/bench_attention.py --short-decode --sweep-shape Qwen3.8 --out /tmp/short.md
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
# --decode-sweep: (name, num_heads, num_kv_heads, head_size), issue #17's shapes
SWEEP_MODELS = [("d256 GQA 6:1 (Qwen3.8-27B)", 24, 4, 256), ("d256 GQA 8:1", 32, 4, 256),
                ("d128 GQA 6:1", 24, 4, 128), ("d128 GQA 8:1", 32, 4, 128),
                ("d64 GQA 6:1", 24, 4, 64), ("d64 GQA 8:1", 32, 4, 64)]
SWEEP_BATCHES = [1, 4, 16, 64]
SWEEP_CONTEXTS = [128, 512, 2048, 4096, 8192, 32768]
SWEEP_SPLITS = [1, 2, 4, 8, 16, 32, 64]
# --short-decode: batches, contexts (1 key, a part of a tile, 1 tile, 1 tile + 1 key, 2 / 3 / 4 / 8 / 32 tiles),
# forced splits
SHORT_BATCHES = [1, 16]
SHORT_CONTEXTS = [1, 16, 64, 65, 128, 192, 256, 512, 2048]
SHORT_SPLITS = [1, 2, 4, 8]


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


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), the HBM reference of the sweep."""
    source = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    ms = median_ms(lambda: target.copy_(source), 10)
    return 2 * source.numel() / (ms / 1e3)


def random_decode_batch(batch_size: int, context: int, kv_heads: int, head_size: int, seed: int) -> dict:
    """One new token per sequence over ``context`` cached tokens (its own included), blocks in random order; random
    keys and values made on the GPU: no dense copy, so 32K contexts at batch 64 fit and are quick to make."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_seq = (context + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = batch_size * blocks_per_seq
    order = torch.randperm(num_blocks, generator=generator, device="cuda").to(torch.int32)
    kv_cache = torch.randn((num_blocks, 2, BLOCK_SIZE, kv_heads, head_size), generator=generator, device="cuda",
                           dtype=torch.float16)
    return {"kv_cache": kv_cache, "block_table": order.view(batch_size, blocks_per_seq),
            "query_start_loc": torch.arange(batch_size + 1, dtype=torch.int32, device="cuda"),
            "seq_lens": torch.full((batch_size,), context, dtype=torch.int32, device="cuda")}


def timed_decode(batch: dict, query: torch.Tensor, max_seq_len: int, splits: int, repeats: int,
                 what: str) -> tuple[float, torch.Tensor]:
    """GPU µs of one SM80-atom decode call (launch hidden) with `splits` (0: the kernel's count) and its output,
    checked NaN-free (it starts as NaN)."""
    out = torch.full_like(query, float("nan"))
    scale = 1.0 / math.sqrt(query.shape[-1])

    def call():
        attention.paged_attention(query, batch["kv_cache"], batch["block_table"], batch["query_start_loc"],
                                  batch["seq_lens"], max_seq_len, scale, out=out, mma=80, num_splits=splits)

    call()
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{what} splits={splits}: NaN in the output"
    return median_ms(call, repeats, hide_launch=True) * 1e3, out


def sweep_case(model: tuple, batch_size: int, context: int, repeats: int, bandwidth: float) -> dict:
    name, heads, kv_heads, head_size = model
    batch = random_decode_batch(batch_size, context, kv_heads, head_size, seed=context + batch_size)
    query = torch.randn((batch_size, heads, head_size), device="cuda", dtype=torch.float16)

    def timed(max_seq_len: int, splits: int) -> tuple[float, torch.Tensor]:
        return timed_decode(batch, query, max_seq_len, splits, repeats, f"{name} B={batch_size} ctx={context}")

    def agrees(out: torch.Tensor, what: str) -> None:  # every split count computes the same attention
        error = float((out.float() - expected.float()).abs().max())
        assert error < 2e-3, f"{name} B={batch_size} ctx={context} {what}: differs by {error}"

    eager_us, expected = timed(context, 0)
    graph_us, graph_out = timed(max(SWEEP_CONTEXTS), 0)
    agrees(graph_out, "graph split count")
    forced = {}
    for splits in SWEEP_SPLITS:  # the kernel uses fewer where they would get no tiles (split_share)
        forced[splits], out = timed(context, splits)
        agrees(out, f"splits={splits}")
    best = min(forced, key=forced.get)
    kv_bytes = 2 * batch_size * context * kv_heads * head_size * 2
    row = {"model": name, "batch": batch_size, "context": context, "eager_us": eager_us, "graph_us": graph_us,
           "best_splits": best, "best_us": forced[best],
           **{f"{key}_hbm": kv_bytes / (us / 1e6) / bandwidth for key, us in
              (("eager", eager_us), ("graph", graph_us), ("best", forced[best]))}}
    print(row, flush=True)
    return row


def timing_floor(model: tuple, repeats: int, bandwidth: float) -> str:
    """What this timing gives for (almost) no work: one and two tiny kernels in a row, and our decode of one cached
    token — the fixed cost a short decode call cannot go below, against which the ≤ 10 µs goal is read."""
    tiny = torch.empty(model[1] * model[3], dtype=torch.float16, device="cuda")
    one_us = median_ms(lambda: tiny.fill_(0), repeats, hide_launch=True) * 1e3
    two_us = median_ms(lambda: (tiny.fill_(0), tiny.fill_(1)), repeats, hide_launch=True) * 1e3
    row = sweep_case(model, 1, 1, repeats, bandwidth)
    return (f"Timing floor (same method): one tiny kernel (a {tiny.numel()}-element fill) {one_us:.1f} µs, two in a "
            f"row {two_us:.1f} µs; our decode of {model[0]} over 1 cached token, batch 1: {row['eager_us']:.1f} µs "
            f"with one split, {row['graph_us']:.1f} µs with the graph's split count (the splits without keys "
            "exit at once).")


def decode_sweep(args, repeats: int) -> str:
    bandwidth = copy_bandwidth()
    models = [model for model in SWEEP_MODELS if args.sweep_shape in model[0]]
    for model in models:  # each shape against SDPA once, on a dense-referenced batch
        run_case("decode", model, 2, 300, 3)
    floor = timing_floor(models[0], repeats, bandwidth)
    rows = [sweep_case(model, batch, context, repeats, bandwidth)
            for model in models for batch in SWEEP_BATCHES for context in SWEEP_CONTEXTS]
    lines = [f"# Paged attention decode sweep — {torch.cuda.get_device_name()}", "",
             f"{datetime.date.today()}, commit {args.commit}, torch {torch.__version__}, SM80 atom, fp16, "
             f"{BLOCK_SIZE}-token blocks in random order. GPU µs per call (median of {repeats}, launch hidden). "
             "eager: the kernel's split count for max_seq_len = the context; graph: for max_seq_len = "
             f"{max(SWEEP_CONTEXTS)} (what a FULL CUDA graph passes); best: the fastest forced split count (the "
             "kernel uses one split below 3 KV tiles, and fewer than forced where they would get no tile or, past "
             "32 splits, fewer than 4, so short contexts repeat a time). "
             f"HBM: the KV bytes' rate against a device copy in the same run ({bandwidth / 1e12:.2f} TB/s).", "",
             floor, "",
             "| shape | batch | context | eager µs | graph µs | best µs (splits) | eager HBM | graph HBM | best HBM |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['context']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | "
                     f"{r['best_us']:.1f} ({r['best_splits']}) | {r['eager_hbm']:.0%} | {r['graph_hbm']:.0%} | "
                     f"{r['best_hbm']:.0%} |")
    return "\n".join(lines) + "\n"


def short_decode(args, repeats: int) -> str:
    """Where a short decode call's time goes: forced split counts from one key to a few KV tiles (64 keys each), so
    that one tile against one key, a second tile in the same split against a second split, and the merge show."""
    model = next(model for model in SWEEP_MODELS if args.sweep_shape in model[0])
    name, heads, kv_heads, head_size = model
    lines = [f"# Short decode calls by split count — {torch.cuda.get_device_name()}", "",
             f"{datetime.date.today()}, commit {args.commit}, {name}, SM80 atom, fp16, {BLOCK_SIZE}-token blocks in "
             f"random order. GPU µs per call (median of {repeats}, launch hidden); the kernel uses no more splits "
             "than KV tiles, and one below 3 tiles.", "",
             "| batch | context | " + " | ".join(f"{s} split{'s' * (s > 1)}" for s in SHORT_SPLITS) +
             " | kernel's count |",
             "|---:|---:|" + "---:|" * (len(SHORT_SPLITS) + 1)]
    for batch_size in SHORT_BATCHES:
        for context in SHORT_CONTEXTS:
            batch = random_decode_batch(batch_size, context, kv_heads, head_size, seed=context + batch_size)
            query = torch.randn((batch_size, heads, head_size), device="cuda", dtype=torch.float16)
            what = f"{name} B={batch_size} ctx={context}"
            times = [timed_decode(batch, query, context, splits, repeats, what)[0] for splits in SHORT_SPLITS + [0]]
            lines.append(f"| {batch_size} | {context} | " + " | ".join(f"{us:.1f}" for us in times) + " |")
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def comparison_table(args, repeats: int) -> str:
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
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--decode-sweep", action="store_true", help="issue #17's decode table instead")
    parser.add_argument("--short-decode", action="store_true",
                        help="short decode calls by forced split count (the first --sweep-shape match)")
    parser.add_argument("--sweep-shape", default="", help="only the sweep's shapes whose name contains this")
    args = parser.parse_args()
    repeats = 5 if args.quick else 20
    mode = decode_sweep if args.decode_sweep else short_decode if args.short_decode else comparison_table
    table = mode(args, repeats)
    print(table)
    with open(args.out, "w") as handle:
        handle.write(table)


if __name__ == "__main__":
    main()
