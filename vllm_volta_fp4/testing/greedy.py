"""Greedy generation through a real vLLM engine, used by ``volta-fp4 demo`` and the end-to-end tests.

Run as ``python -m vllm_volta_fp4.testing.greedy SPEC.json OUT.json`` (or through ``generate_in_subprocess``) it
generates for several models one after the other in one process (each engine is shut down before the next starts)
and writes token ids and log-probabilities as JSON.
SPEC: ``{"runs": [{"name", "model", "engine_args": {...}, "env": {...}}], "prompts": [...], "max_tokens": N}``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_PROMPTS = ["hello world", "the capital of france is", "my name is volta and i", "one two three four"]

# Engine settings that need none of vLLM's compiled kernels (vllm._C): every CustomOp and vLLM-IR op in its native
# PyTorch form, no torch.compile, no CUDA graphs, no custom all-reduce. That is newer vLLM on a V100 (its wheels have
# no sm_70 kernels) and the GPU test kit (vLLM's pure-Python part only); the plugin's own kernels are unaffected.
WITHOUT_VLLM_KERNELS = {
    "enforce_eager": True,
    "compilation_config": {"custom_ops": ["none"]},
    "ir_op_priority": {"rms_norm": ["native"]},  # vLLM >= 0.20; older versions have no IR ops
    "disable_custom_all_reduce": True,
}
# The two ways an engine runs under that constraint: vLLM's default mode (torch.compile + CUDA graphs; Inductor writes
# the native ops) and eager.
ENGINE_MODES = {"default": {**WITHOUT_VLLM_KERNELS, "enforce_eager": False}, "eager": WITHOUT_VLLM_KERNELS}


def supported_engine_args(engine_args: dict) -> dict:
    """``engine_args`` without the settings this vLLM version does not have (e.g. ir_op_priority on 0.19.1)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {field.name for field in dataclasses.fields(EngineArgs)}
    return {key: value for key, value in engine_args.items() if key in known}


@dataclass
class Generation:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    logprobs: list[float]
    runner_up_logprobs: list[float]  # per step, the second most likely token's log-probability (-inf if none)

    def first_divergence(self, other: Generation) -> int | None:
        """Index of the first generated token that differs from ``other``'s, None if all agree."""
        for index, (mine, theirs) in enumerate(zip(self.token_ids, other.token_ids, strict=True)):
            if mine != theirs:
                return index
        return None

    def margin(self, step: int) -> float:
        """How far the greedy choice at ``step`` was ahead of the runner-up, in log-probability."""
        return self.logprobs[step] - self.runner_up_logprobs[step]


def generate_greedy(llm, prompts: list[list[int]], max_tokens: int):
    """vLLM's outputs of greedy ``max_tokens``-token completions (EOS ignored, no log-probabilities) of token-id
    ``prompts`` by an existing ``vllm.LLM``: what the benchmarks time and profile."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": prompt} for prompt in prompts], params, use_tqdm=False)


def generate_with(llm, prompts: list[str] | list[list[int]], max_tokens: int) -> list[Generation]:
    """Greedy completions of ``prompts`` (strings or token ids) by an existing ``vllm.LLM``."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, ignore_eos=True)
    inputs = [{"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt for prompt in prompts]
    outputs = llm.generate(inputs, params, use_tqdm=False)
    results = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        chosen, runner_up = [], []
        for step, token in zip(completion.logprobs, completion.token_ids, strict=True):
            chosen.append(step[token].logprob)
            others = [entry.logprob for candidate, entry in step.items() if candidate != token]
            runner_up.append(max(others, default=float("-inf")))
        results.append(Generation(prompt, completion.text, list(completion.token_ids), chosen, runner_up))
    return results


def greedy_generate(model: str, prompts: list[str], max_tokens: int = 32, **engine_args) -> list[Generation]:
    """Greedy completions of ``prompts`` by ``model`` with vLLM; ``engine_args`` go to ``vllm.LLM``."""
    # A tiny model needs a tiny KV cache; vLLM's CPU backend otherwise reserves several GiB.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    engine_args = {"enforce_eager": True, "max_model_len": 256, **engine_args}
    llm = LLM(model=model, **engine_args)
    try:
        return generate_with(llm, prompts, max_tokens)
    finally:
        del llm
        gc.collect()


def generate_in_subprocess(spec: dict, log: Path | None = None) -> dict[str, list[Generation]]:
    """Run ``spec``'s engines in a fresh Python process (the module's ``main``); their log goes to ``log`` (None: to
    this process's output). Raises RuntimeError naming the log when the process fails."""
    with tempfile.TemporaryDirectory(prefix="volta-fp4-greedy-") as scratch:
        spec_file, out_file = Path(scratch) / "spec.json", Path(scratch) / "out.json"
        spec_file.write_text(json.dumps(spec))
        command = [sys.executable, "-m", __name__, str(spec_file), str(out_file)]
        if log is None:
            returncode = subprocess.run(command).returncode
        else:
            with log.open("w") as sink:
                returncode = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode
        if returncode != 0:
            raise RuntimeError(f"the vLLM engine process failed (exit {returncode})"
                               + (f"; its log: {log}" if log is not None else ""))
        results = json.loads(out_file.read_text())
    return {name: [Generation(**g) for g in generations] for name, generations in results.items()}


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
