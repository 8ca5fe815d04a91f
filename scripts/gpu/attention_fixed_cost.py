#!/usr/bin/env python3
"""Where a short decode call's time goes (issue #17, the ≤ 10 µs goal): event times of the Qwen3.8-27B decode shape
(d256, GQA 6:1, batch 1) at 1 and 128 cached tokens with one split, alone, twice in a row, and after a tiny kernel,
beside one tiny kernel; then ``ncu`` (run_attention_fixed_cost.sh) gives the kernel's own duration and its stalls.

    python scripts/gpu/attention_fixed_cost.py [--ncu]   (from the repository root, the wheel's extension in place)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from bench_attention import random_decode_batch  # noqa: E402
from event_timing import median_ms  # noqa: E402

from vllm_volta_fp4.ops import attention  # noqa: E402

HEADS, KV_HEADS, HEAD_SIZE = 24, 4, 256


def decode_call(context: int):
    batch = random_decode_batch(1, context, KV_HEADS, HEAD_SIZE, seed=context)
    query = torch.randn((1, HEADS, HEAD_SIZE), device="cuda", dtype=torch.float16)
    out = torch.empty_like(query)

    def call():
        attention.paged_attention(query, batch["kv_cache"], batch["block_table"], batch["query_start_loc"],
                                  batch["seq_lens"], context, 1 / math.sqrt(HEAD_SIZE), out=out, mma=80, num_splits=1)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncu", action="store_true", help="a few calls only, for the profiler")
    args = parser.parse_args()
    tiny = torch.empty(HEADS * HEAD_SIZE, dtype=torch.float16, device="cuda")
    calls = {context: decode_call(context) for context in (1, 128)}
    if args.ncu:
        for call in calls.values():
            call()
        torch.cuda.synchronize()
        return
    repeats = 50
    print(f"one tiny kernel: {median_ms(lambda: tiny.fill_(0), repeats, hide_launch=True) * 1e3:.1f} µs")
    for context, call in calls.items():
        alone = median_ms(call, repeats, hide_launch=True) * 1e3
        twice = median_ms(lambda call=call: (call(), call()), repeats, hide_launch=True) * 1e3
        after_tiny = median_ms(lambda call=call: (tiny.fill_(0), call()), repeats, hide_launch=True) * 1e3
        print(f"decode, {context} cached tokens, one split: alone {alone:.1f} µs, twice in a row {twice:.1f} µs, "
              f"after a tiny kernel {after_tiny:.1f} µs")


if __name__ == "__main__":
    main()
