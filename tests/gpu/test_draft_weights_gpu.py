"""The MTP drafter's quantized weights (FP8, NVFP4) on the CUDA kernels: the case tables of
tests/plugin/test_draft_weights.py, whose CPU run replaces the kernels by the reference (skipped without CUDA and the
built extension)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import requires_vllm
from tests.plugin.test_draft_weights import CASES, FORMATS, LAYER_CASES, check_head, check_layer, quantized_dense
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.models import draft_weights
from vllm_volta_fp4.plugin.models.draft_weights import weight_refusal

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not linear.is_available(), reason="needs CUDA and the built extension")]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rows", "hidden", "m"), CASES)
def test_head_logits_on_the_kernels(monkeypatch, rows, hidden, m, fmt):
    monkeypatch.setattr(draft_weights, "_QUANTIZE_ELEMENTS", hidden * 7)
    torch.manual_seed(rows)
    weight = (torch.randn(rows, hidden, device="cuda") * 0.05).half()
    weight[rows // 2, 3] = 0.9
    assert weight_refusal(weight, "the head", whole_rows=False) is None
    check_head(weight, torch.randn(m, hidden, device="cuda").half(), fmt)


@requires_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rows", "cols", "m"), LAYER_CASES)
def test_layer_quantized_in_place_on_the_kernels(rows, cols, m, fmt):
    check_layer(rows, cols, m, fmt, "cuda")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_quantizer_gives_the_same_head_on_cuda_and_cpu(fmt):
    """The copy is quantized on the GPU; the recipe is the CPU reference's, bit for bit."""
    torch.manual_seed(7)
    weight = (torch.randn(1000, 256, device="cuda") * 0.05).half()
    weight[500, 3] = 0.9
    assert torch.equal(quantized_dense(weight, fmt).cpu(), quantized_dense(weight.cpu(), fmt))
