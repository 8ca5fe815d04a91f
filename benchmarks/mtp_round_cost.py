#!/usr/bin/env python3
"""What MTP speculation buys at Qwen3.8-27B widths: the cost of one speculative round (K drafts through the MTP
layer + verification of K + 1 tokens) against a plain decode step, batch 1, K = 1..7, with volta_nvfp4 in vLLM's
default mode (torch.compile + CUDA graphs, native custom ops) or eager.

Model: ``--model`` (e.g. the 64-layer checkpoint of benchmarks/full_depth_e2e.py, which carries the MTP module),
or ``--layers`` decoder layers of Qwen3.8-27B (tiny_model.qwen3_8_27b: 3 Gated-DeltaNet : 1 full attention) plus
its one-layer MTP module, random weights made on the GPU, NVFP4 (MTP excluded, as real exports ship it). Random
weights accept almost no drafts, so every engine step is one whole round; the round count comes from vLLM's
spec-decode counters (drafts), and the round time is the decode time divided by the rounds. Wall-clock: decode
time of N extra tokens over the same prompt with one token (as benchmarks/throughput_e2e.py measures decode); GPU
time: kernel time per decoded token from the torch profiler (devkit.gpu_time: the prompt's prefill subtracted,
split by kernel family) times the tokens per round. Implied tok/s at acceptance length L: L / round, with L
capped at K + 1 (a round cannot emit more), from the wall-clock round and from the GPU round (what a
GPU-bound host, e.g. a V100's slower GPU under the same host work, would see).

The drafter runs its 16-bit layers quantized in place and scores the vocabulary with a copy of lm_head, both FP8 or
NVFP4 (plugin/models/draft_weights.py) or, with ``--draft-formats fp16`` (VLLM_VOLTA_FP4_DRAFT_WEIGHTS=0), all in 16
bits as vLLM drafts; ``fp8,fp16`` measures both per K. The made checkpoint's vocabulary is the tokenizer's (hundreds
of tokens) unless ``--vocab`` sets it (248,320 is Qwen3.8's: the head's cost shows only at a real vocabulary).

    python3 benchmarks/mtp_round_cost.py --out results.md --commit abc1234 [--layers 8 | --model DIR]
        [--vocab 248320] [--ks 1,2,3,4,5,6,7] [--draft-formats fp8,nvfp4,fp16] [--eager] [--host-profile DIR]

On the GPU machine: scripts/gpu/run_mtp_gpu.sh (after the lossless tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from devkit.engine import DRAFT_FORMATS
from devkit.gpu_time import FAMILIES, gpu_time_per_decode_token
from devkit.host_time import host_profile
from vllm_volta_fp4.testing.greedy import generate_greedy

# Published MTP acceptance lengths (tokens per round) of Qwen3.5/3.8 at K = 3 (or near it): SGLang's Qwen3.5 H200
# FP8 cookbook pins 3.39 at 3 speculative tokens (sgl-project/sglang PR #35194); ik_llama.cpp measures 3.72-3.76 on
# code/extraction and 2.39 on stories at 3 drafts (ikawrakow/ik_llama.cpp PR #2369, a Qwen3.8 MoE); issue #16 quotes
# 2.8-3.8. L = 3 is the middle of that range.
ACCEPTANCE = 3
PUBLISHED_ACCEPTANCE = ("2.4-3.8 at K = 3: 3.39 in SGLang's Qwen3.5 cookbook (sglang PR #35194), 2.39 story to 3.76 "
                        "code in ik_llama.cpp PR #2369; issue #16 quotes 2.8-3.8")


def _engine(model: str, k: int | None, eager: bool, max_len: int):
    from vllm import LLM

    from vllm_volta_fp4.testing.greedy import ENGINE_MODES, supported_engine_args

    settings = {**ENGINE_MODES["eager" if eager else "default"], "model": model, "quantization": "volta_nvfp4",
                "dtype": "float16", "max_model_len": max_len, "max_num_seqs": 1,
                # A fixed cache and a small share: an in-process engine does not give all its memory back when
                # deleted, and the next engine's start checks the free memory against its share.
                "gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": 2**30,
                "enable_prefix_caching": False, "language_model_only": True, "gdn_prefill_backend": "triton",
                "attention_backend": "CUSTOM", "seed": 0,
                "disable_log_stats": False}  # stats on: the spec-decode counters give the rounds
    if k:
        settings["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
    return LLM(**supported_engine_args(settings))


def _decode_seconds(llm, prompt: list[int], tokens: int) -> float:
    def timed(n: int) -> float:
        start = time.perf_counter()
        generate_greedy(llm, [prompt], n)
        return time.perf_counter() - start

    timed(tokens)  # warm-up
    return statistics.median(timed(tokens + 1) - timed(1) for _ in range(3))


def measure(model: str, k: int | None, eager: bool, tokens: int, drafter: str = "fp8",
            host_profile_dir: Path | None = None) -> dict:
    import torch

    from devkit.engine import drafter_format, spec_decode_counters, use_draft_format

    use_draft_format(drafter)
    prompt = [(7 * i + 11) % 300 + 5 for i in range(64)]
    llm = _engine(model, k, eager, 64 + 4 * tokens)
    try:
        wall = _decode_seconds(llm, prompt, tokens)  # time of `tokens` decoded tokens
        before = spec_decode_counters(llm)["num_drafts"]
        generate_greedy(llm, [prompt], tokens)
        rounds = (spec_decode_counters(llm)["num_drafts"] - before) if k else tokens  # a round per draft
        if rounds <= 0:
            raise RuntimeError(f"K={k}: vLLM counted no speculative rounds; speculation did not run")
        if k and drafter_format(llm) != drafter:
            raise RuntimeError(f"K={k}: asked for a drafter in {drafter}, it runs {drafter_format(llm)}")
        tokens_per_round = tokens / rounds
        # kernel time per decoded token (the prompt's prefill subtracted), by family, scaled to a round
        gpu = gpu_time_per_decode_token(llm, [prompt], tokens)
        if host_profile_dir:
            name = f"host-profile-k{k or 0}{'-' + drafter if k else ''}.log"  # .log: the call's log archive takes it
            host_profile(llm, [prompt], tokens, host_profile_dir / name)
        return {"k": k or 0, "drafter": drafter if k else "", "wall_ms_per_round": 1e3 * wall / rounds,
                "tokens_per_round": tokens_per_round,
                "gpu_ms_per_round": 1e3 * gpu["all"] * tokens_per_round,
                "gpu_ms_by_family": {family: 1e3 * gpu.get(family, 0.0) * tokens_per_round for family in FAMILIES}}
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def table(rows: list[dict], args) -> str:
    plain = rows[0]
    lines = [f"# MTP round cost at Qwen3.8-27B widths ({args.layers} layers + MTP), batch 1, "
             f"{'eager' if args.eager else 'default mode'}", "",
             f"Date {datetime.date.today()}, commit {args.commit}, GPU {args.gpu}.", "",
             f"Implied tok/s use acceptance length L = min({ACCEPTANCE}, K + 1) ({PUBLISHED_ACCEPTANCE}); "
             "wall: L / wall round, GPU: L / GPU round.", "",
             "| K | drafter's weights | wall ms / round | × plain step | GPU ms / round | × plain step | "
             "implied tok/s wall / GPU | "
             + " | ".join(f"GPU ms {family}" for family in FAMILIES) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(FAMILIES)]
    for row in rows:
        accepted = min(ACCEPTANCE, row["k"] + 1)  # a plain step (k = 0) emits one token
        lines.append(f"| {row['k'] or 'plain'} | {row['drafter']} | {row['wall_ms_per_round']:.2f} | "
                     f"{row['wall_ms_per_round'] / plain['wall_ms_per_round']:.2f} | {row['gpu_ms_per_round']:.2f} | "
                     f"{row['gpu_ms_per_round'] / plain['gpu_ms_per_round']:.2f} | "
                     f"{accepted * 1e3 / row['wall_ms_per_round']:.1f} / "
                     f"{accepted * 1e3 / row['gpu_ms_per_round']:.1f} | "
                     + " | ".join(f"{row['gpu_ms_by_family'][family]:.2f}" for family in FAMILIES) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--gpu", default=os.environ.get("GPU_NAME", "unknown"))
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the checkpoint made here")
    parser.add_argument("--model", type=Path, help="an NVFP4 Qwen3.5-architecture checkpoint with its MTP module "
                        "instead (e.g. the full-depth one of benchmarks/full_depth_e2e.py)")
    parser.add_argument("--vocab", type=int, help="vocabulary of the checkpoint made here (default: the tokenizer's)")
    parser.add_argument("--ks", default="1,2,3,4,5,6,7",
                        help="speculative token counts, comma-separated (each engine start takes ~1-2 min in default "
                             "mode at 27B widths: split K = 1..7 over device calls)")
    parser.add_argument("--draft-formats", default="fp8", help=f"comma-separated of {list(DRAFT_FORMATS)}: the "
                        "drafter's weights (layers and lm_head copy), each measured per K")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--host-profile", type=Path, metavar="DIR",
                        help="also write each engine's Python profile of one generate there (devkit.host_time)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm_volta_fp4
    from devkit.engine import use_torch_allocator_for_triton
    from vllm_volta_fp4.testing.tiny_model import make_checkpoint, qwen3_8_27b, stream_hybrid_checkpoint

    vllm_volta_fp4.register()
    use_torch_allocator_for_triton()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model = str(args.model)
            args.layers = json.loads((args.model / "config.json").read_text())["text_config"]["num_hidden_layers"]
        else:
            model = tmp
            shape = dataclasses.replace(qwen3_8_27b(args.layers), mtp_layers=1)
            if args.vocab:  # layer by layer: the embeddings and lm_head alone are 2.5 GB each at 248,320
                stream_hybrid_checkpoint(tmp, shape, "modelopt-w4a16", device="cuda", vocab=args.vocab)
            else:
                make_checkpoint(tmp, shape, "modelopt-w4a16", device="cuda")
        drafters = args.draft_formats.split(",")
        runs = [(None, drafters[0])] + [(int(part), fmt) for part in args.ks.split(",") for fmt in drafters]
        rows = []
        for k, fmt in runs:
            rows.append(measure(model, k, args.eager, args.tokens, fmt, args.host_profile))
            text = table(rows, args)
            args.out.write_text(text)  # after every engine: a run stopped at its time limit keeps its rows
            print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
