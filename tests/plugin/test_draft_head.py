"""The MTP drafts' quantized lm_head (plugin/models/draft_head.py), FP8 and NVFP4: when it is made, that it quantizes
the head as one tensor whatever the chunking, and that the drafter's logits come from it while the head it loaded
stays as it was.

On CPU the kernel face (ops.linear's prepare_* / *_linear) is replaced by the reference on the serving
tensors; tests/gpu/test_draft_head_gpu.py runs the same cases on the CUDA kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import requires_vllm
from vllm_volta_fp4.format.nvfp4 import (
    dequantize_fp8,
    dequantize_nvfp4,
    fp8_linear_reference,
    nvfp4_linear_reference,
    quantize_fp8,
    quantize_nvfp4,
)
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.models import draft_head
from vllm_volta_fp4.plugin.models.draft_head import DraftHeadMixin, QuantizedDraftHead, draft_head_refusal

# (vocabulary rows, hidden, M rows of hidden states): odd row counts, more rows than one GEMV strip, M = 1…17.
CASES = [(200, 64, 1), (333, 128, 3), (1000, 256, 8), (129, 96, 17)]
FORMATS = ["fp8", "nvfp4"]


def quantized_dense(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """The head as the reference recipe quantizes it (as one tensor, on the weight's device), decoded to float64."""
    if fmt == "nvfp4":
        q = quantize_nvfp4(weight.float())
        return dequantize_nvfp4(q.packed, q.block_scale, q.global_scale, torch.float64)
    return dequantize_fp8(*quantize_fp8(weight.float(), per_channel=True), dtype=torch.float64)


def check_head(weight: torch.Tensor, x: torch.Tensor, fmt: str) -> None:
    bias = torch.linspace(-1, 1, weight.shape[0], device=weight.device).half()
    logits = QuantizedDraftHead(weight, fmt)(x, bias)
    assert logits.shape == (x.shape[0], weight.shape[0]) and logits.dtype == torch.float16
    want = x.double() @ quantized_dense(weight, fmt).T + bias.double()
    error = (logits.double() - want).abs()
    worst = divmod(int(error.argmax()), weight.shape[0])
    assert error.max().item() <= 2e-3 * want.abs().max().item(), (  # fp16 output, fp32 accumulation
        f"worst logit [{worst[0]}, {worst[1]}]: {logits[worst].item()} vs {want[worst].item()}; "
        f"{int((error > 2e-3 * want.abs().max()).sum())} of {error.numel()} beyond tolerance")


def whole_row_groups(rows: int) -> None:
    """The kernels' contract (csrc/driver/weight_gemm_driver.cpp): N and K are multiples of 16."""
    if rows % 16:
        raise RuntimeError(f"N = {rows} is not a multiple of 16")


@pytest.fixture
def reference_kernels(monkeypatch):
    """The kernel face on CPU: 'prepared' tensors are the serving tensors, the GEMM is the reference."""
    def prepare_nvfp4(packed, block_scale, global_scale):
        whole_row_groups(packed.shape[0])
        return {"weight_tiles": packed, "row_scale": block_scale, "split_k_counters": torch.as_tensor(global_scale)}

    def prepare_fp8(codes, scale):
        whole_row_groups(codes.shape[0])
        return {"weight_tiles": codes, "row_scale": scale}

    monkeypatch.setattr(linear, "runs_on", lambda tensor: True)
    monkeypatch.setattr(linear, "prepare_nvfp4", prepare_nvfp4)
    monkeypatch.setattr(linear, "nvfp4_linear", lambda x, t, bias=None: nvfp4_linear_reference(
        x.float(), t["weight_tiles"], t["row_scale"], t["split_k_counters"], bias).half())
    monkeypatch.setattr(linear, "prepare_fp8", prepare_fp8)
    monkeypatch.setattr(linear, "fp8_linear", lambda x, t, bias=None: fp8_linear_reference(
        x.float(), t["weight_tiles"], t["row_scale"], bias).half())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rows", "hidden", "m"), CASES)
def test_head_logits_equal_the_whole_tensor_quantization(reference_kernels, monkeypatch, rows, hidden, m, fmt):
    monkeypatch.setattr(draft_head, "_QUANTIZE_ELEMENTS", hidden * 7)  # 7 rows per chunk: a ragged last chunk
    torch.manual_seed(rows)
    weight = (torch.randn(rows, hidden) * 0.05).half()
    weight[rows // 2, 3] = 0.9  # one large weight: NVFP4's global scale must come from all chunks
    check_head(weight, torch.randn(m, hidden).half(), fmt)


class FakeMtpModel(nn.Module):
    """What the mixin relies on in vLLM's Qwen3_5MTP: quant_config, lm_head.weight, logits_processor(head, h),
    load_weights and compute_logits."""

    def __init__(self, quant_config, weight: torch.Tensor):
        super().__init__()
        self.quant_config = quant_config
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(weight, requires_grad=False)
        self.base_logits_calls = 0

    def logits_processor(self, head, hidden_states):
        return head.quant_method.apply(head, hidden_states)

    def load_weights(self, weights):
        return {"lm_head.weight"}

    def compute_logits(self, hidden_states, spec_step_idx=0):
        self.base_logits_calls += 1
        return hidden_states @ self.lm_head.weight.T


class Drafter(DraftHeadMixin, FakeMtpModel):
    pass


def volta_config():
    from vllm_volta_fp4.format.checkpoint import parse_quant_config
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    return VoltaNvfp4Config(parse_quant_config({"producer": {"name": "modelopt"},
                                                "quantization": {"quant_algo": "NVFP4"}}))


@requires_vllm
@pytest.mark.parametrize(("setting", "fmt"), [(None, "fp8"), ("nvfp4", "nvfp4")])
def test_drafter_scores_drafts_with_the_copy_and_keeps_its_head(reference_kernels, monkeypatch, setting, fmt):
    if setting is None:
        monkeypatch.delenv("VLLM_VOLTA_FP4_DRAFT_HEAD", raising=False)
    else:
        monkeypatch.setenv("VLLM_VOLTA_FP4_DRAFT_HEAD", setting)
    torch.manual_seed(0)
    weight = (torch.randn(160, 64) * 0.05).half()
    drafter = Drafter(volta_config(), weight.clone())
    assert drafter.load_weights([]) == {"lm_head.weight"}
    assert isinstance(drafter.draft_head, QuantizedDraftHead) and drafter.draft_head.fmt == fmt
    x = torch.randn(2, 64).half()
    logits = drafter.compute_logits(x)
    assert drafter.base_logits_calls == 0
    want = x.double() @ quantized_dense(weight, fmt).T
    assert (logits.double() - want).abs().max().item() <= 2e-3 * want.abs().max().item()
    assert torch.equal(drafter.lm_head.weight, weight)  # verification's head is untouched


@requires_vllm
def test_drafter_without_the_copy_is_vllms(monkeypatch):
    """On CPU the kernels do not run, so the drafter keeps vLLM's compute_logits (and says why in its log)."""
    drafter = Drafter(volta_config(), torch.randn(64, 32).half())
    drafter.load_weights([])
    assert "draft_head" not in drafter._modules
    drafter.compute_logits(torch.randn(1, 32).half())
    assert drafter.base_logits_calls == 1


class Head(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.lm_head = nn.Module()
        self.lm_head.weight = weight


@pytest.mark.parametrize(("setting", "volta", "weight", "why"), [
    ("0", True, torch.zeros(64, 32, dtype=torch.float16), "VLLM_VOLTA_FP4_DRAFT_HEAD is off"),
    (None, False, torch.zeros(64, 32, dtype=torch.float16), "not served by volta_nvfp4"),
    (None, True, torch.zeros(64, 32, dtype=torch.uint8), "no 16-bit weight matrix"),
    (None, True, torch.zeros(64, 32, dtype=torch.bfloat16), "torch.bfloat16"),
    (None, True, torch.zeros(64, 24, dtype=torch.float16), "hidden size 24 is not a multiple of 16"),
    (None, True, torch.zeros(64, 32, dtype=torch.float16), "CUDA kernels do not run here"),
], ids=["off", "other-quantization", "not-float", "bf16", "hidden-24", "no-kernels"])
def test_refusals_name_the_reason(monkeypatch, setting, volta, weight, why):
    if setting is None:
        monkeypatch.delenv("VLLM_VOLTA_FP4_DRAFT_HEAD", raising=False)
    else:
        monkeypatch.setenv("VLLM_VOLTA_FP4_DRAFT_HEAD", setting)
    monkeypatch.setattr(linear, "runs_on", lambda tensor: False)
    assert why in draft_head_refusal(Head(weight), volta)


def test_a_head_with_nan_is_refused(reference_kernels):
    weight = torch.zeros(64, 32, dtype=torch.float16)
    weight[5, 7] = float("nan")
    assert "NaN or Inf" in draft_head_refusal(Head(weight), True)
    assert draft_head_refusal(Head(torch.ones(64, 32, dtype=torch.float16)), True) is None
