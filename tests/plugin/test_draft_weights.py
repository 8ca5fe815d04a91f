"""The MTP drafter's quantized weights (plugin/models/draft_weights.py), FP8 and NVFP4: when they are made, that the
head is quantized as one tensor whatever the chunking, that the drafter's logits come from the copy while the head it
loaded stays as it was, and that its 16-bit linear layers are replaced by their quantization (the checkpoint's
quantized layers and layers the kernels cannot take are left alone).

On CPU the kernel face (ops.linear's prepare_* / *_linear) is replaced by the reference on the serving
tensors; tests/gpu/test_draft_weights_gpu.py runs the same cases on the CUDA kernels."""

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
from vllm_volta_fp4.plugin.models import draft_weights
from vllm_volta_fp4.plugin.models.draft_weights import (
    DraftLinearMethod,
    DraftWeightsMixin,
    QuantizedDraftHead,
    draft_weights_refusal,
    quantize_layer_in_place,
    weight_refusal,
)

# (vocabulary rows, hidden, M rows of hidden states): odd row counts, more rows than one GEMV strip, M = 1…17.
CASES = [(200, 64, 1), (333, 128, 3), (1000, 256, 8), (129, 96, 17)]
# A drafter layer quantized in place (rows, cols, M): fc-like 2h → h, gate_up-like, down-like.
LAYER_CASES = [(64, 128, 1), (352, 96, 4), (96, 352, 17)]
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


def check_layer(rows: int, cols: int, m: int, fmt: str, device: str) -> None:
    """A 16-bit linear layer quantized in place runs x · Ŵᵀ (+ bias) on the quantized weight alone."""
    torch.manual_seed(rows * cols)
    weight = (torch.randn(rows, cols, device=device) * 0.05).half()
    layer = fake_linear(weight.clone())
    assert quantize_layer_in_place(layer, fmt) > 0 and "weight" not in layer._parameters
    x, bias = torch.randn(m, cols, device=device).half(), torch.randn(rows, device=device).half()
    got = layer.quant_method.apply(layer, x, bias)
    want = x.double() @ quantized_dense(weight, fmt).T + bias.double()
    assert got.shape == (m, rows) and got.dtype == torch.float16
    assert (got.double() - want).abs().max().item() <= 2e-3 * want.abs().max().item()


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
    monkeypatch.setattr(draft_weights, "_QUANTIZE_ELEMENTS", hidden * 7)  # 7 rows per chunk: a ragged last chunk
    torch.manual_seed(rows)
    weight = (torch.randn(rows, hidden) * 0.05).half()
    weight[rows // 2, 3] = 0.9  # one large weight: NVFP4's global scale must come from all chunks
    check_head(weight, torch.randn(m, hidden).half(), fmt)


def fake_linear(weight: torch.Tensor, quant_method=None) -> nn.Module:
    """A vLLM linear layer as the mixin sees one: a LinearBase whose forward is quant_method.apply(self, x, bias)
    (vLLM's own need a tensor-parallel group)."""
    from vllm_volta_fp4.plugin.compat import LinearBase, UnquantizedLinearMethod

    class FakeLinear(LinearBase):
        def __init__(self):
            nn.Module.__init__(self)
            self.weight = nn.Parameter(weight, requires_grad=False)
            self.quant_method = quant_method or UnquantizedLinearMethod()

        def forward(self, x):
            return self.quant_method.apply(self, x, None)

    return FakeLinear()


class FakeMtpModel(nn.Module):
    """What the mixin relies on in vLLM's Qwen3_5MTP: quant_config, lm_head.weight, logits_processor(head, h),
    load_weights, compute_logits and its linear layers (fc and one layer's projections here)."""

    def __init__(self, quant_config, weight: torch.Tensor, layers: dict[str, nn.Module] | None = None):
        super().__init__()
        self.quant_config = quant_config
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(weight, requires_grad=False)
        self.layers = nn.ModuleDict(layers or {})
        self.base_logits_calls = 0

    def logits_processor(self, head, hidden_states):
        return head.quant_method.apply(head, hidden_states)

    def load_weights(self, weights):
        return {"lm_head.weight"}

    def compute_logits(self, hidden_states, spec_step_idx=0):
        self.base_logits_calls += 1
        return hidden_states @ self.lm_head.weight.T


class Drafter(DraftWeightsMixin, FakeMtpModel):
    pass


def volta_config():
    from vllm_volta_fp4.format.checkpoint import parse_quant_config
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    return VoltaNvfp4Config(parse_quant_config({"producer": {"name": "modelopt"},
                                                "quantization": {"quant_algo": "NVFP4"}}))


def set_draft_weights(monkeypatch, setting: str | None) -> None:
    if setting is None:
        monkeypatch.delenv("VLLM_VOLTA_FP4_DRAFT_WEIGHTS", raising=False)
    else:
        monkeypatch.setenv("VLLM_VOLTA_FP4_DRAFT_WEIGHTS", setting)


@requires_vllm
@pytest.mark.parametrize(("setting", "fmt"), [(None, "fp8"), ("nvfp4", "nvfp4")])
def test_drafter_scores_drafts_with_the_copy_and_keeps_its_head(reference_kernels, monkeypatch, setting, fmt):
    set_draft_weights(monkeypatch, setting)
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
@pytest.mark.parametrize(("setting", "fmt"), [(None, "fp8"), ("nvfp4", "nvfp4")])
def test_drafter_layers_are_quantized_in_place(reference_kernels, monkeypatch, setting, fmt):
    """fc and the layer's 16-bit projections run on the quantized weight and no longer hold the 16-bit one; a layer
    the checkpoint quantized keeps its method; a layer of rows the kernels cannot take stays 16-bit."""
    set_draft_weights(monkeypatch, setting)
    torch.manual_seed(1)
    weights = {"fc": (torch.randn(64, 128) * 0.05).half(), "qkv_proj": (torch.randn(96, 64) * 0.05).half(),
               "odd_rows": (torch.randn(40, 64) * 0.05).half(), "quantized": (torch.randn(32, 64) * 0.05).half()}
    checkpoint_method = DraftLinearMethod("nvfp4", ())  # stands for the checkpoint's own NVFP4 method
    layers = {name: fake_linear(w.clone(), checkpoint_method if name == "quantized" else None)
              for name, w in weights.items()}
    drafter = Drafter(volta_config(), (torch.randn(160, 64) * 0.05).half(), layers)
    drafter.load_weights([])
    for name in ("fc", "qkv_proj"):
        layer = drafter.layers[name]
        assert "weight" not in layer._parameters and layer.quant_method.fmt == fmt, name
        x = torch.randn(3, weights[name].shape[1]).half()
        want = x.double() @ quantized_dense(weights[name], fmt).T
        got = layer(x)
        assert got.shape == (3, weights[name].shape[0]) and got.dtype == torch.float16
        assert (got.double() - want).abs().max().item() <= 2e-3 * want.abs().max().item(), name
    assert torch.equal(drafter.layers["odd_rows"].weight, weights["odd_rows"])  # 40 rows: not whole 16-row groups
    assert drafter.layers["quantized"].quant_method is checkpoint_method
    assert torch.equal(drafter.layers["quantized"].weight, weights["quantized"])


@requires_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rows", "cols", "m"), LAYER_CASES)
def test_layer_quantized_in_place(reference_kernels, rows, cols, m, fmt):
    check_layer(rows, cols, m, fmt, "cpu")


@requires_vllm
def test_drafter_without_the_copy_is_vllms(monkeypatch):
    """On CPU the kernels do not run, so the drafter keeps vLLM's compute_logits and its 16-bit layers (and says why
    in its log)."""
    from vllm_volta_fp4.plugin.compat import UnquantizedLinearMethod

    drafter = Drafter(volta_config(), torch.randn(64, 32).half(), {"fc": fake_linear(torch.randn(32, 64).half())})
    drafter.load_weights([])
    assert "draft_head" not in drafter._modules
    assert isinstance(drafter.layers["fc"].quant_method, UnquantizedLinearMethod)
    drafter.compute_logits(torch.randn(1, 32).half())
    assert drafter.base_logits_calls == 1


@requires_vllm
def test_switched_off_the_drafter_keeps_every_16_bit_weight(reference_kernels, monkeypatch):
    set_draft_weights(monkeypatch, "0")
    layer = fake_linear(torch.randn(32, 64).half())
    drafter = Drafter(volta_config(), torch.randn(64, 32).half(), {"fc": layer})
    drafter.load_weights([])
    assert "draft_head" not in drafter._modules and "weight" in layer._parameters


@pytest.mark.parametrize(("setting", "volta", "why"), [
    ("0", True, "VLLM_VOLTA_FP4_DRAFT_WEIGHTS is off"),
    (None, False, "not served by volta_nvfp4"),
], ids=["off", "other-quantization"])
def test_drafter_refusals_name_the_reason(monkeypatch, setting, volta, why):
    set_draft_weights(monkeypatch, setting)
    assert why in draft_weights_refusal(volta)


@pytest.mark.parametrize(("weight", "whole_rows", "why"), [
    (torch.zeros(64, 32, dtype=torch.uint8), False, "no 16-bit weight matrix"),
    (torch.zeros(64, 32, dtype=torch.bfloat16), False, "torch.bfloat16"),
    (torch.zeros(64, 24, dtype=torch.float16), False, "shape (64, 24) is not in whole 16-element groups"),
    (torch.zeros(40, 32, dtype=torch.float16), True, "shape (40, 32) is not in whole 16-element groups"),
    (torch.zeros(64, 32, dtype=torch.float16), False, "CUDA kernels do not run here"),
], ids=["not-float", "bf16", "hidden-24", "rows-40", "no-kernels"])
def test_weight_refusals_name_the_reason(monkeypatch, weight, whole_rows, why):
    monkeypatch.setattr(linear, "runs_on", lambda tensor: False)
    assert why in weight_refusal(weight, "its lm_head", whole_rows=whole_rows)


def test_a_weight_with_nan_is_refused(reference_kernels):
    weight = torch.zeros(64, 32, dtype=torch.float16)
    weight[5, 7] = float("nan")
    assert "NaN or Inf" in weight_refusal(weight, "its lm_head", whole_rows=False)
    assert weight_refusal(torch.ones(40, 32, dtype=torch.float16), "its lm_head", whole_rows=False) is None
