"""fp16 safety (issue #8 part 4): a tiny Qwen3.5 given bf16-typical massive activations stays finite and close to
the fp32 reference in the plugin's fp16 arithmetic; an activation beyond fp16 overflows where the harness says and
fp32 sublayer outputs remove it. CPU only (transformers).

Tolerance for "close": max |logit - fp32 logit| <= 1e-2 * max(1, max |fp32 logit|). fp16 stores every activation
with a relative rounding of 2^-11 ~ 4.9e-4; this 4-layer model rounds each token's activations ~20 times between
the embedding and the logits, so a few 1e-3 of the logit range is the expected fp16 error — the unstressed model
shows 2e-3 — and 1e-2 leaves a 2x margin while an overflow gives inf/NaN or errors of order 1.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.qwen3_5")  # a transformers with Qwen3.5

from devkit import fp16_safety as fs  # noqa: E402

TOKENS = fs.example_tokens()
EXTREME = fs.Stress(super_activation=4.0e4, super_weight=2.5)


def _close(run: fs.Record, reference: fs.Record) -> bool:
    error = (run.logits - reference.logits).abs().max().item()
    return error <= 1e-2 * max(1.0, reference.logits.abs().max().item())


@pytest.fixture(scope="module")
def stressed():
    model = fs.stress_weights(fs.build_model(), fs.Stress(), TOKENS)
    return model, fs.instrumented_forward(model, TOKENS)


def test_stress_gives_the_intended_fp32_statistics(stressed):
    _, reference = stressed
    sites = reference.sites
    assert sites["L1.act"].max_abs == pytest.approx(2.0e4, rel=1e-3)   # the super activation, calibrated
    assert sites["L1.resid"].max_abs == pytest.approx(3.0e4, rel=1e-2)  # massive channels from layer 1 on ...
    assert sites["L3.resid"].max_abs == pytest.approx(3.0e4, rel=1e-2)  # ... riding the residual stream
    assert sites["L0.resid"].max_abs < 10                                 # not before the emergence layer
    assert sites["L2.act"].max_abs > 100                                  # down_proj-input outlier channels
    assert all(s.finite and s.max_abs < fs.FP16_MAX for s in sites.values())


def test_unstressed_model_is_fp16_safe_everywhere():
    """Control: no false positive on the plain random model."""
    model = fs.build_model()
    reference = fs.instrumented_forward(model, TOKENS)
    run = fs.instrumented_forward(model, TOKENS, torch.float16, residual="vllm")
    assert run.first_nonfinite() is None
    assert _close(run, reference)


def test_bf16_typical_activations_are_safe_in_vllms_fp16_arithmetic(stressed):
    """The requirement: with bf16-typical massive/super activations and outlier channels the plugin's fp16 serving
    (vLLM's fp32 residual, our fp32-accumulating linear kernels, fp16 sublayer outputs) stays finite and close."""
    model, reference = stressed
    run = fs.instrumented_forward(model, TOKENS, torch.float16, residual="vllm")
    assert run.first_nonfinite() is None
    assert _close(run, reference)
    assert run.sites["L1.down"].max_abs == pytest.approx(reference.sites["L1.down"].max_abs, rel=1e-2)


def test_sublayer_output_beyond_fp16_needs_fp32_outputs():
    model = fs.stress_weights(fs.build_model(), EXTREME, TOKENS)
    reference = fs.instrumented_forward(model, TOKENS)
    assert reference.sites["L1.down"].max_abs > fs.FP16_OVERFLOW  # the massive value is written in one go
    # transformers (fp16 residual) and vLLM (fp32 residual) alike: down_proj's fp16 output is already inf
    for residual in ("model", "vllm"):
        run = fs.instrumented_forward(model, TOKENS, torch.float16, residual=residual)
        assert run.first_nonfinite() == "L1.down"
        assert not torch.isfinite(run.logits).all()
    fixed = fs.instrumented_forward(model, TOKENS, torch.float16, residual="fp32-outputs")
    assert fixed.first_nonfinite() is None
    assert _close(fixed, reference)
