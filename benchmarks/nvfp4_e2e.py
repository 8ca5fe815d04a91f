#!/usr/bin/env python3
"""vLLM end to end on the GPU with the whole plugin: tiny NVFP4 checkpoints (made here by vllm_volta_fp4.tiny_model)
served with ``quantization="volta_nvfp4"`` (our CUDA GEMMs) under vLLM's Triton attention and under our CUSTOM
attention backend, against the same model dequantized to fp16 and served unquantized by the same engine.

Runs on the GPU machine after the shared gpu-vllm-kit is installed (benchmarks/run_all_gpu.sh does it):
    python3 benchmarks/nvfp4_e2e.py --kit .gpu-kit
Prints token matches per prompt and "NVFP4-E2E-OK" when every run of the plugin gives the reference's tokens.
fp16 arithmetic differs between our GEMM and cuBLAS, so a random model's near-tie may flip a late token; the
output says how many tokens match, not only whether all do.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import tempfile
from pathlib import Path

MAX_TOKENS = 32


def run(kit_gen, model_dir: Path, backend: str, prompts: list[list[int]], quantized: bool):
    import torch
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    kwargs = kit_gen.llm_kwargs(str(model_dir), backend)
    kwargs.update(enable_prefix_caching=True, max_num_batched_tokens=64)  # chunked prefill, prefix hits
    if quantized:
        kwargs["quantization"] = "volta_nvfp4"
    known = {field.name for field in dataclasses.fields(EngineArgs)}
    llm = LLM(**{key: value for key, value in kwargs.items() if key in known})
    used = kit_gen.backend_name(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, seed=0)
    outputs = llm.generate([{"prompt_token_ids": prompt} for prompt in prompts], params, use_tqdm=False)
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return used, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", required=True)
    parser.add_argument("--formats", default="ct-w4a16,modelopt-mixed")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("kit_gen", str(Path(args.kit) / "gen.py"))
    kit_gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit_gen)  # sets the kit's in-process, offline environment

    import vllm_volta_fp4
    from vllm_volta_fp4 import kernels
    from vllm_volta_fp4.convert import convert_to_dense
    from vllm_volta_fp4.tiny_model import make_tiny_checkpoint

    vllm_volta_fp4.register()  # the engine runs in this process; no installed entry point on this machine
    print(f"extension available: {kernels.is_available()}", flush=True)
    shared_prefix = [(7 * i + 11) % 300 + 5 for i in range(48)]
    prompts = [shared_prefix + [17, 42, 99], shared_prefix + [23, 5], [(13 * i) % 300 + 5 for i in range(150)], [9]]
    root = Path(tempfile.mkdtemp(prefix="nvfp4-e2e-"))
    failed = False
    for fmt in args.formats.split(","):
        quantized = make_tiny_checkpoint(root / fmt, "qwen3", fmt)
        dense = convert_to_dense(quantized, root / f"{fmt}-dense", dtype=torch.float16)
        _, reference = run(kit_gen, dense, "TRITON_ATTN", prompts, quantized=False)
        for backend in ("TRITON_ATTN", "CUSTOM"):
            used, tokens = run(kit_gen, quantized, backend, prompts, quantized=True)
            matches = [sum(a == b for a, b in zip(ours, theirs)) for ours, theirs in zip(tokens, reference)]
            identical = all(ours == theirs for ours, theirs in zip(tokens, reference))
            print(f"{fmt} volta_nvfp4 + {backend} (engine used {used}): tokens matching the fp16 dense model "
                  f"per prompt {matches} of {MAX_TOKENS}{' — identical' if identical else ''}", flush=True)
            failed |= not identical
            if backend == "CUSTOM" and torch.cuda.is_available() and "CUSTOM" not in used:
                print("NVFP4-E2E-FAIL: the engine did not run the plugin's attention backend", flush=True)
                failed = True
    print("NVFP4-E2E-FAIL" if failed else "NVFP4-E2E-OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
