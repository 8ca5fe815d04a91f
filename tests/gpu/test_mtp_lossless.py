"""MTP speculative decoding is lossless with volta_nvfp4: a tiny Qwen3.5 NVFP4 checkpoint with a one-layer MTP module
(every producer format; the MTP module excluded from quantization as real exports ship it, or NVFP4 too) generates
the same greedy tokens with ``speculative_config={"method": "mtp", "num_speculative_tokens": K}`` as without, for
K = 1 and 3, one prompt alone (batch 1) and four together (batch 4), in vLLM's default mode (torch.compile + CUDA
graphs, native custom ops) and eager. The drafter runs its 16-bit layers quantized to FP8 and scores its drafts with
the plugin's FP8 copy of lm_head (the default; plugin/models/draft_weights.py), and the test checks it does.

"mtp" is the method's name in vLLM 0.19.1, 0.20.2 and 0.32.0 alike ("qwen3_5_mtp" is a deprecated alias that each
of them rewrites to "mtp"). The verification step runs our attention (query length K + 1 per sequence); the
Gated-DeltaNet layers run vLLM's kernels (the plugin's run on compute capability 7.x only), except in
test_mtp_is_lossless_with_our_gdn_kernels: a V100's mix, prompts and plain steps on our GDN kernels and speculative
batches on vLLM's (plugin/gdn_layer.py declines them) over the same state caches.
Random weights accept few drafts, so rejection and rollback of the GDN state are exercised on nearly every step.
Tokens must be identical, except at a near-tie of the non-speculative run (NEAR_TIE, as in test_vllm_end_to_end):
verification computes K + 1 tokens in one forward, so fp16 GEMMs of another shape may round differently there.

Skipped without CUDA, vLLM or the built extension. On the GPU machine: scripts/gpu/run_mtp_gpu.sh.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from devkit.engine import drafter_format, spec_decode_counters
from tests.gpu.test_vllm_end_to_end import (
    ENGINE,
    MAX_TOKENS,
    PROMPTS,
    QWEN3_5,
    assert_same_greedy,
    engine_environment,  # noqa: F401  (autouse: the same engine environment for this module)
    pytestmark,  # noqa: F401  (same skips and marks)
    result_of_fresh_process,
    start_engine,
)
from vllm_volta_fp4.testing.greedy import ENGINE_MODES, Generation, generate_with
from vllm_volta_fp4.testing.tiny_model import FORMATS, make_tiny_checkpoint

MTP_METHOD = "mtp"
MODES = {"eager": ENGINE_MODES["eager"], "default": ENGINE_MODES["default"]}  # the order of the test ids
# Speculative batches and prefix caching of the hybrid's GDN state are a separate question; keep it off here.
# Stats on: vLLM's spec-decode counters are how the test knows drafts were made (LLM turns them off by default).
SPEC_ENGINE = {**QWEN3_5, "quantization": "volta_nvfp4", "attention_backend": "CUSTOM",
               "enable_prefix_caching": False, "disable_log_stats": False}
CASES = [(fmt, "unquantized") for fmt in FORMATS] + [(fmt, "nvfp4") for fmt in ("modelopt-nvfp4", "ct-w4a16")]


class SpecRuns:
    """(checkpoint, mode, K or None) → (batch-1 generations, batch-4 generations, spec metrics), each made once."""

    def __init__(self, root: Path):
        self.root = root
        self.cache: dict[tuple, tuple[list[Generation], list[Generation], dict]] = {}

    def checkpoint(self, fmt: str, mtp: str) -> Path:
        path = self.root / f"qwen3_5-{fmt}-mtp-{mtp}"
        if not path.exists():
            make_tiny_checkpoint(path, "qwen3_5", fmt, mtp=mtp)
        return path

    def run(self, fmt: str, mtp: str, mode: str, k: int | None):
        key = (fmt, mtp, mode, k)
        if key not in self.cache:
            settings = {**ENGINE, **SPEC_ENGINE, **MODES[mode], "model": str(self.checkpoint(fmt, mtp))}
            if k is not None:
                settings["speculative_config"] = {"method": MTP_METHOD, "num_speculative_tokens": k}
            llm = start_engine(settings)
            try:
                alone = [generate_with(llm, [prompt], MAX_TOKENS)[0] for prompt in PROMPTS]
                together = generate_with(llm, PROMPTS, MAX_TOKENS)
                counts = {**spec_decode_counters(llm), "drafter": drafter_format(llm)}
                self.cache[key] = (alone, together, counts)
            finally:
                del llm
                gc.collect()
                torch.cuda.empty_cache()
        return self.cache[key]


@pytest.fixture(scope="module")
def spec_runs(tmp_path_factory):
    return SpecRuns(tmp_path_factory.mktemp("mtp"))


# One xdist group per checkpoint and mode (pytest -n N --dist loadgroup): its K = 1 and K = 3 tests share one worker,
# so the plain engine they compare with starts once.
ENGINE_GROUPS = [pytest.param(fmt, mtp, mode, marks=pytest.mark.xdist_group(f"{fmt}-{mtp}-{mode}"))
                 for fmt, mtp in CASES for mode in MODES]


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize(("fmt", "mtp", "mode"), ENGINE_GROUPS)
def test_mtp_speculation_is_lossless(spec_runs, triton_allocator, fmt, mtp, mode, k):
    plain_alone, plain_together, _ = spec_runs.run(fmt, mtp, mode, None)
    spec_alone, spec_together, counts = spec_runs.run(fmt, mtp, mode, k)
    what = f"{fmt} (MTP {mtp}) {mode} K={k}"
    assert_same_greedy(spec_alone, plain_alone, f"{what} batch 1, speculative vs plain")
    assert_same_greedy(spec_together, plain_together, f"{what} batch 4, speculative vs plain")
    drafts = counts["num_drafts"]
    assert drafts > 0, f"{what}: the engine made no drafts ({counts}): speculation did not run"
    drafter = counts["drafter"]
    assert drafter == "fp8", f"{what}: the drafter runs {drafter} weights, not FP8 layers and lm_head copy"


# A fresh process per engine pair: the GDN overrides are registered per process (plugin/gdn_layer.py).
_OUR_GDN_SCRIPT = """
import dataclasses, gc, json, sys
import torch
from vllm import LLM
from devkit.engine import engine_model, gdn_layers_on_our_kernels, spec_decode_counters, use_torch_allocator_for_triton
from vllm_volta_fp4.testing.greedy import generate_with, supported_engine_args
use_torch_allocator_for_triton()
prompts, tokens, runs = json.loads(sys.argv[2]), int(sys.argv[3]), {}
for name, settings in json.loads(sys.argv[1]).items():
    llm = LLM(**supported_engine_args(settings))
    alone = [generate_with(llm, [prompt], tokens)[0] for prompt in prompts]
    together = generate_with(llm, prompts, tokens)
    runs[name] = {"layers": gdn_layers_on_our_kernels(engine_model(llm)), "counts": spec_decode_counters(llm),
                  "alone": [dataclasses.asdict(g) for g in alone],
                  "together": [dataclasses.asdict(g) for g in together]}
    del llm
    gc.collect()
    torch.cuda.empty_cache()
print("RESULT", json.dumps(runs))
"""


@pytest.mark.parametrize("mode", list(MODES))
def test_mtp_is_lossless_with_our_gdn_kernels(spec_runs, mode):
    """A V100's configuration (VLLM_VOLTA_FP4_GDN=force stands in for compute capability 7.x): prompts and plain
    steps on our GDN kernels, speculative batches on vLLM's (ours decline them) over the same state caches. K = 3,
    batch 1 and 4: greedy output with speculation equals the output without."""
    model = str(spec_runs.checkpoint("ct-w4a16", "unquantized"))
    plain = {**ENGINE, **SPEC_ENGINE, **MODES[mode], "model": model}
    engines = {"plain": plain,
               "spec": {**plain, "speculative_config": {"method": MTP_METHOD, "num_speculative_tokens": 3}}}
    runs = result_of_fresh_process(_OUR_GDN_SCRIPT, [json.dumps(engines), json.dumps(PROMPTS), str(MAX_TOKENS)],
                                   {"VLLM_VOLTA_FP4_GDN": "force"}, timeout=500)
    for name, run in runs.items():
        assert run["layers"] == 3, f"{name}: {run['layers']} GDN layers run our kernels (the tiny Qwen3.5 has 3)"
    assert runs["spec"]["counts"]["num_drafts"] > 0, f"no drafts ({runs['spec']['counts']}): speculation did not run"
    for batch in ("alone", "together"):
        spec, ref = ([Generation(**g) for g in runs[name][batch]] for name in ("spec", "plain"))
        assert_same_greedy(spec, ref, f"our GDN kernels, {mode}, K=3, {batch}: speculative vs plain")
