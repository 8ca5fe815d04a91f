#!/usr/bin/env python3
"""vLLM end to end with the VOLTA_HMMA attention backend, on the GPU machine with the shared gpu-vllm-kit.

Tiny random fp16 Qwen3 models (head_dim 64 and 256, GQA 2:1) generate greedily in one process, first with
vLLM's TRITON_ATTN and then with our backend (``--attention-backend CUSTOM``), both against Hugging Face greedy
decoding of the same weights. Prompts are long enough, and the token budget per step small enough, that
prefill is chunked; two prompts share a 48-token prefix, so with prefix caching the second one starts from
cached blocks. Prints the backend each engine really used and the matches; exits non-zero unless our backend
ran and its tokens match Hugging Face's as well as TRITON_ATTN's do (fp16 drift may flip a late token of a
random model in either).

    python3 benchmarks/attention_e2e.py --kit .gpu-kit      # after the kit's run_on_gpu.sh install steps
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys

MAX_TOKENS = 16


def load_kit(kit: str):
    spec = importlib.util.spec_from_file_location("kit_gen", os.path.join(kit, "gen.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # also sets the kit's in-process, offline environment
    return module


def tiny_qwen3(kit_gen, out_dir: str, head_dim: int) -> str:
    """The kit's tiny Qwen3 with the head_dim we ask for (its config is rewritten before saving)."""
    import transformers

    original = transformers.Qwen3Config

    def config_with_head_dim(**kwargs):
        return original(**{**kwargs, "head_dim": head_dim})

    transformers.Qwen3Config = config_with_head_dim
    try:
        return kit_gen.make_tiny_qwen3(out_dir)
    finally:
        transformers.Qwen3Config = original


def generate(kit_gen, model_dir: str, backend: str, prompts: list[list[int]]):
    import dataclasses

    import torch
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    kwargs = kit_gen.llm_kwargs(model_dir, backend)
    kwargs.update(enable_prefix_caching=True, max_num_batched_tokens=64)  # chunked prefill, prefix hits
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    llm = LLM(**{k: v for k, v in kwargs.items() if k in known})
    used = kit_gen.backend_name(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, seed=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return used, tokens


def hf_greedy(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16).cuda()
    result = []
    for prompt in prompts:
        ids = torch.tensor([prompt], device="cuda")
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=3)
        result.append(out[0, ids.shape[1]:].tolist())
    del model
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", required=True, help="the gpu-vllm-kit folder (gen.py, tok/)")
    args = parser.parse_args()
    kit_gen = load_kit(args.kit)
    from vllm_volta_fp4.plugin.attention_backend import register_attention_backend

    register_attention_backend()  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    shared_prefix = [(7 * i + 11) % 500 + 5 for i in range(48)]
    prompts = [shared_prefix + [17, 42, 99], shared_prefix + [23, 5], [(13 * i) % 500 + 5 for i in range(150)], [9]]
    failed = False
    for head_dim in (64, 256):
        model_dir = tiny_qwen3(kit_gen, f"/tmp/e2e-attention-qwen3-d{head_dim}", head_dim)
        reference = hf_greedy(model_dir, prompts)
        matches = {}
        for backend in ("TRITON_ATTN", "CUSTOM"):
            used, tokens = generate(kit_gen, model_dir, backend, prompts)
            matches[backend] = [sum(a == b for a, b in zip(t, r)) for t, r in zip(tokens, reference)]
            print(f"head_dim {head_dim} {backend}: engine used {used}; tokens matching HF per prompt "
                  f"{matches[backend]} of {MAX_TOKENS}", flush=True)
            if backend == "CUSTOM" and "CUSTOM" not in used:
                print("E2E-FAIL: the engine did not run the VOLTA_HMMA backend")
                failed = True
        if sum(matches["CUSTOM"]) < sum(matches["TRITON_ATTN"]):
            print(f"E2E-FAIL: head_dim {head_dim}: our backend matches HF less often than TRITON_ATTN")
            failed = True
    print("E2E-FAIL" if failed else "E2E-OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
