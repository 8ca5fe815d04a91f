#!/usr/bin/env python3
"""vLLM's own acceptance of MTP drafts on a trained tiny Qwen3.5 NVFP4 checkpoint, served by volta_nvfp4: the
acceptance length from vLLM's spec-decode counters, whether the speculative greedy tokens equal the plain ones (with
drafts really accepted, unlike random weights), and the decode speed-up at batch 1.

The checkpoint comes from ``python -m devkit.mtp_training --out DIR`` (trained on CPU in minutes; its torch
simulation of the same acceptance is benchmarks/results/mtp-acceptance-cpu.md). Held-out prompts are the ones that
simulation uses (same seed). A model this small is host-bound on any GPU: its speed-up says what vLLM's
speculation loop costs on the host, not what a 27B model gains (benchmarks/mtp_round_cost.py is that).

    python3 benchmarks/mtp_acceptance_vllm.py --model DIR --out results.md --commit abc1234 [--ks 1,2,3]
        [--draft-formats fp8,nvfp4,fp16] [--mode eager]

``--draft-formats``: the drafter's weights — its layers and the lm_head copy its drafts score with
(VLLM_VOLTA_FP4_DRAFT_WEIGHTS; fp16 = the checkpoint's, as vLLM drafts), each run at every K.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]


def run(model: Path, k: int | None, mode: str, prompts: list[list[int]], new_tokens: int,
        drafter: str = "fp8") -> dict:
    """Greedy tokens of every prompt alone (batch 1), decode seconds, and the spec-decode counters of the run."""
    import torch
    from vllm import LLM, SamplingParams

    from devkit.engine import SPEC_DECODE_COUNTERS, spec_decode_counters, use_draft_format
    from vllm_volta_fp4.testing.greedy import ENGINE_MODES, generate_with, supported_engine_args

    use_draft_format(drafter)

    settings = {**ENGINE_MODES[mode], "model": str(model), "quantization": "volta_nvfp4", "dtype": "float16",
                "max_model_len": 256, "max_num_seqs": 4, "gpu_memory_utilization": 0.3,
                "kv_cache_memory_bytes": 256 * 2**20, "enable_prefix_caching": False, "language_model_only": True,
                "gdn_prefill_backend": "triton", "attention_backend": "CUSTOM", "seed": 0,
                "disable_log_stats": False}
    if k:
        settings["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
    llm = LLM(**supported_engine_args(settings))
    try:
        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        llm.generate([{"prompt_token_ids": prompts[0]}], greedy, use_tqdm=False)  # warm-up
        before = spec_decode_counters(llm) if k else None
        decode_seconds = 0.0
        for prompt in prompts:
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)
            middle = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompt}], first, use_tqdm=False)  # prefill + first token alone
            decode_seconds += (middle - start) - (time.perf_counter() - middle)
        # The tokens, with the runner-up's log-probability at each step, from an untimed pass (logprobs cost time)
        generations = [generate_with(llm, [prompt], new_tokens)[0] for prompt in prompts]
        counts = {}
        if k:
            after = spec_decode_counters(llm)
            counts = {name: after[name] - before[name] for name in SPEC_DECODE_COUNTERS}
            counts["per_position"] = [a - b for a, b in
                                      zip(after["per_position"], before["per_position"] or [0.0] * k, strict=False)]
        return {"k": k or 0, "drafter": drafter if k else "", "generations": generations,
                "decode_tok_s": len(prompts) * (new_tokens - 1) / decode_seconds, **counts}
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()


NEAR_TIE = 0.05  # as tests/gpu/test_vllm_end_to_end.py


def divergences(ours, plain) -> list[tuple[int, float]]:
    """(prompt, plain's top-two margin at the first differing token) for every prompt whose tokens differ."""
    return [(index, theirs.margin(step)) for index, (mine, theirs) in enumerate(zip(ours, plain, strict=True))
            if (step := mine.first_divergence(theirs)) is not None]


def lossless(ours, plain) -> bool:
    return all(margin < NEAR_TIE for _, margin in divergences(ours, plain))


def agreement(ours, plain) -> str:
    """"24/24", or "23/24; prompt 5 at a near-tie (margin 0.012)" (or "NOT a near-tie")."""
    text = f"{len(ours) - len(divergences(ours, plain))}/{len(ours)}"
    for index, margin in divergences(ours, plain):
        text += f"; prompt {index} at {'a near-tie' if margin < NEAR_TIE else 'NOT a near-tie'} (margin {margin:.3f})"
    return text


def table(rows: list[dict], args, gpu: str) -> str:
    import vllm

    plain = rows[0]
    count = len(plain["generations"])
    lines = [f"# MTP acceptance in vLLM: trained tiny Qwen3.5, volta_nvfp4, {args.mode} mode — {gpu}", "",
             f"Date {datetime.date.today()}, commit {args.commit}, vLLM {vllm.__version__}, "
             f"`benchmarks/mtp_acceptance_vllm.py --ks {args.ks} --draft-formats {args.draft_formats}` on the "
             "checkpoint of "
             f"`python -m devkit.mtp_training --seed {args.seed}` ({args.model.name}).", "",
             f"{count} held-out prompts, each alone (batch 1), {args.new_tokens} greedy tokens. "
             "Acceptance length = 1 + accepted / drafts from vLLM's spec-decode counters (tokens per verification "
             "round). Lossless: the speculative greedy tokens equal the plain engine's, or first differ where the "
             f"plain engine's top two tokens were within {NEAR_TIE} in log-probability (verification computes K + 1 "
             "tokens in one forward: fp16 GEMMs of another shape round differently). The model is tiny and "
             "host-bound: its decode speed-up measures vLLM's speculation loop on the host, not a 27B model's gain.",
             "", "| K | drafter's weights | drafts | acceptance length | acceptance rate per draft position | prompts "
             "identical to plain | decode tok/s | × plain |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        same = agreement(row["generations"], plain["generations"])
        if row["k"]:
            drafts = row["num_drafts"]
            length = f"{1 + row['num_accepted_tokens'] / drafts:.2f}" if drafts else "no drafts"
            rates = ", ".join(f"{value / drafts:.2f}" for value in row["per_position"]) if drafts else ""
            lines.append(f"| {row['k']} | {row['drafter']} | {drafts:.0f} | {length} | {rates} | {same} | "
                         f"{row['decode_tok_s']:.0f} | {row['decode_tok_s'] / plain['decode_tok_s']:.2f} |")
        else:
            lines.append(f"| plain | | | | | | {row['decode_tok_s']:.0f} | 1.00 |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint written by devkit.mtp_training")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--seed", type=int, default=0, help="the training seed (held-out prompts use seed + 1000)")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--ks", default="1,2,3", help="speculative token counts, comma-separated")
    parser.add_argument("--draft-formats", default="fp8", help="comma-separated of fp8, nvfp4, fp16 "
                        "(devkit.engine.DRAFT_FORMATS)")
    parser.add_argument("--mode", choices=("default", "eager"), default="default")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    import vllm_volta_fp4
    from devkit.engine import use_torch_allocator_for_triton
    from devkit.mtp_training import held_out_prompts

    vllm_volta_fp4.register()
    use_torch_allocator_for_triton()
    prompts = held_out_prompts(args.model, args.seed, args.prompts)
    drafters = args.draft_formats.split(",")
    rows = []
    for k, fmt in [(None, drafters[0])] + [(int(k), fmt) for fmt in drafters for k in args.ks.split(",")]:
        rows.append(run(args.model, k, args.mode, prompts, args.new_tokens, fmt))
        print(f"K={k or 0}: {({key: v for key, v in rows[-1].items() if key != 'generations'})}", flush=True)
    text = table(rows, args, torch.cuda.get_device_name(0))
    args.out.write_text(text)
    print(text)
    return 0 if all(lossless(row["generations"], rows[0]["generations"]) for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
