"""volta-fp4 plan MODEL_DIR|CONFIG --gpu … --max-model-len N: memory budget and the vLLM flags that fit it."""

from __future__ import annotations

import sys

from vllm_volta_fp4 import envs
from vllm_volta_fp4.toolkit.planner import GPU_PRESETS, PlanError, ServeRequest, format_plan, parse_gpu, plan_for

HELP = "will this model fit this GPU at this context length? weights, KV cache, reserves, and the vLLM flags"


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model directory (exact, from checkpoint headers) or a config.json (estimate)")
    parser.add_argument("--gpu", required=True, help=f"{' | '.join(GPU_PRESETS)} | memory in GiB")
    parser.add_argument("--max-model-len", type=int, required=True, help="longest sequence (prompt + output)")
    parser.add_argument("--max-num-seqs", type=int, help="concurrent sequences (default: as many as can all reach "
                        "max-model-len at once)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (GPUs per model; vLLM's "
                        "--tensor-parallel-size)")
    parser.add_argument("--max-num-batched-tokens", type=int, help="prefill chunk size (default 2048)")
    parser.add_argument("--enforce-eager", action="store_true", help="plan without CUDA graphs")
    parser.add_argument("--speculative-tokens", type=int, default=0, metavar="K",
                        help="plan MTP speculative decoding with K draft tokens (the MTP module's weights and KV)")
    parser.add_argument("--language-model-only", action="store_true",
                        help="text-only serving: vLLM does not load the vision tower (its --language-model-only)")


def run(args) -> int:
    try:
        request = ServeRequest(parse_gpu(args.gpu), args.max_model_len, args.max_num_seqs, args.tp,
                               args.max_num_batched_tokens, args.enforce_eager, args.speculative_tokens,
                               envs.draft_weights_format(), args.language_model_only)
        plan = plan_for(args.model, request)
    except PlanError as error:
        print(f"volta-fp4 plan: {error}", file=sys.stderr)
        return 2
    print(format_plan(plan))
    return 0 if plan.fits else 1
