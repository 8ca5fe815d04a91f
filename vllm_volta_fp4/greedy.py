"""Greedy generation through a real vLLM engine, used by ``volta-fp4 demo`` and the end-to-end tests.

Run as ``python -m vllm_volta_fp4.greedy SPEC.json OUT.json`` it generates for several models one after the other in
one process (each engine is shut down before the next starts) and writes token ids and log-probabilities as JSON.
SPEC: ``{"runs": [{"name", "model", "engine_args": {...}, "env": {...}}], "prompts": [...], "max_tokens": N}``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from dataclasses import asdict, dataclass

DEFAULT_PROMPTS = ["hello world", "the capital of france is", "my name is volta and i", "one two three four"]


@dataclass
class Generation:
    prompt: str
    text: str
    token_ids: list[int]
    logprobs: list[float]


def greedy_generate(model: str, prompts: list[str], max_tokens: int = 32, **engine_args) -> list[Generation]:
    """Greedy completions of ``prompts`` by ``model`` with vLLM; ``engine_args`` go to ``vllm.LLM``."""
    # A tiny model needs a tiny KV cache; vLLM's CPU backend otherwise reserves several GiB.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    engine_args = {"enforce_eager": True, "max_model_len": 256, **engine_args}
    llm = LLM(model=model, **engine_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            chosen = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
            results.append(Generation(prompt, completion.text, list(completion.token_ids), chosen))
        return results
    finally:
        del llm
        gc.collect()


def main(argv: list[str] | None = None) -> None:
    spec_file, out_file = argv or sys.argv[1:3]
    with open(spec_file) as handle:
        spec = json.load(handle)
    results = {}
    for run in spec["runs"]:
        saved = dict(os.environ)
        os.environ.update(run.get("env", {}))  # e.g. CPU thread binding for a tensor-parallel run
        try:
            generations = greedy_generate(run["model"], spec.get("prompts", DEFAULT_PROMPTS),
                                          spec.get("max_tokens", 32), **run.get("engine_args", {}))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        results[run["name"]] = [asdict(g) for g in generations]
    with open(out_file, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
