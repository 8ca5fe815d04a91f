"""A quantized copy of the language-model head for MTP drafts.

vLLM's MTP drafter shares the main model's lm_head and scores the whole vocabulary with it for every draft token:
Qwen3.8-27B's head is 248,320 × 5,120 in 16 bits (2.54 GB, as exports ship it), so K = 3 drafts read 7.6 GB per
verification round — on a V100 almost half of what the 64-layer decode step itself reads (benchmarks/v100_budget.py).
Drafts only propose tokens; the main model's 16-bit head still scores verification, so the output is token for token
what it is without speculation whatever the drafts' head: a draft whose argmax moves is at worst a rejected draft.
This module quantizes the head once at load and gives the drafter its logits from our weight-only GEMMs:
  * FP8 E4M3 with one scale per row (the default): 1.27 GB, ~3 % relative weight error, so the drafts' argmax
    moves only where the 16-bit logits nearly tie;
  * NVFP4 (NVIDIA's recipe): 0.72 GB, ~10 % relative weight error; half the reads again, more moved drafts.
(Exports keep lm_head in 16 bits because its errors reach every output token; here they reach only the proposals.)

DraftHeadMixin goes in front of vLLM's MTP model class (plugin/models/qwen3_5_mtp.py); it changes nothing unless the
model is served by volta_nvfp4 where the plugin's CUDA kernels run, and VLLM_VOLTA_FP4_DRAFT_HEAD is not off."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta_fp4 import envs
from vllm_volta_fp4.format.nvfp4 import BLOCK_SIZE, global_decode_scale, quantize_fp8, quantize_nvfp4
from vllm_volta_fp4.ops import linear

# Rows quantized at a time: the reference quantizers hold a few int64/float32 copies of their input, so ~8M elements
# per chunk keep the transient memory at load under ~0.5 GB on a 16 GB V100.
_QUANTIZE_ELEMENTS = 1 << 23


def _chunks(weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return weight.split(max(1, _QUANTIZE_ELEMENTS // weight.shape[1]))


def _amax(weight: torch.Tensor) -> torch.Tensor:
    """max |w| in float32, chunk by chunk (no full-size temporary); NaN or Inf if the weight holds one."""
    amax = torch.zeros((), dtype=torch.float32, device=weight.device)
    for chunk in _chunks(weight):
        amax = torch.maximum(amax, chunk.abs().amax().float())
    return amax


def _quantized_rows(weight: torch.Tensor, quantize, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Fill ``outputs`` (row-aligned with ``weight``) chunk by chunk with ``quantize(chunk)``'s tensors: no second
    full-size copy while the kernels' layout is made from them."""
    row = 0
    for chunk in _chunks(weight):
        for output, part in zip(outputs, quantize(chunk), strict=True):
            output[row:row + chunk.shape[0]] = part
        row += chunk.shape[0]
    return outputs


def _prepared_nvfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    global_scale = global_decode_scale(_amax(weight))  # one tensor: the scale sees every chunk
    rows, cols = weight.shape

    def quantize(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = quantize_nvfp4(chunk, global_scale)
        return q.packed, q.block_scale

    packed, block_scale = _quantized_rows(weight, quantize, (
        weight.new_empty(rows, cols // 2, dtype=torch.uint8),
        weight.new_empty(rows, cols // BLOCK_SIZE, dtype=torch.float8_e4m3fn)))
    return linear.prepare_nvfp4(packed, block_scale, global_scale)


def _prepared_fp8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, cols = weight.shape
    codes, scale = _quantized_rows(weight, lambda chunk: quantize_fp8(chunk, per_channel=True),
                                   (weight.new_empty(rows, cols, dtype=torch.float8_e4m3fn),
                                    weight.new_empty(rows, dtype=torch.float32)))
    return linear.prepare_fp8(codes, scale)


# format → (quantize + prepare, GEMM)
_FORMATS = {envs.DRAFT_FP8: (_prepared_fp8, lambda: linear.fp8_linear),
            envs.DRAFT_NVFP4: (_prepared_nvfp4, lambda: linear.nvfp4_linear)}


class DraftHeadMethod:
    """What vLLM's LogitsProcessor calls on a head (``lm_head.quant_method.apply(lm_head, x, bias=...)``)."""

    @staticmethod
    def apply(layer: QuantizedDraftHead, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return layer(x, bias)


class QuantizedDraftHead(nn.Module):
    """``weight`` [rows, hidden] (the head's rows on this tensor-parallel rank, padding included) quantized to
    ``fmt`` (envs.DRAFT_FP8 or DRAFT_NVFP4) in the kernels' tile layout. ``forward(x)`` = x · Ŵᵀ in fp16."""

    def __init__(self, weight: torch.Tensor, fmt: str):
        super().__init__()
        prepare, self._gemm = _FORMATS[fmt]
        self.fmt, self.shape = fmt, tuple(weight.shape)
        # The GEMMs take whole 16-row groups; vLLM pads the head's rows to 64 already, other callers get zero rows
        # that forward cuts off.
        self._extra_rows = -weight.shape[0] % BLOCK_SIZE
        weight = weight.detach()
        if self._extra_rows:  # (never a copy of a real head: 2.5 GB)
            weight = nn.functional.pad(weight, (0, 0, 0, self._extra_rows))
        prepared = prepare(weight)
        self.tensor_names = tuple(prepared)
        for name, tensor in prepared.items():
            self.register_buffer(name, tensor, persistent=False)
        self.quant_method = DraftHeadMethod()

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None:
            bias = nn.functional.pad(bias, (0, self._extra_rows))
        logits = self._gemm()(x, {name: getattr(self, name) for name in self.tensor_names}, bias)
        return logits[..., :self.shape[0]] if self._extra_rows else logits

    def bytes(self) -> int:
        return sum(getattr(self, name).numel() * getattr(self, name).element_size() for name in self.tensor_names)


def draft_head_refusal(model: nn.Module, served_by_volta_nvfp4: bool) -> str | None:
    """Why ``model`` (an MTP draft model after loading) keeps drafting with its 16-bit lm_head, or None."""
    if envs.draft_head_format() is None:
        return f"{envs.DRAFT_HEAD.name} is off"
    if not served_by_volta_nvfp4:
        return "the model is not served by volta_nvfp4"
    weight = getattr(getattr(model, "lm_head", None), "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        return "its lm_head has no 16-bit weight matrix"
    if weight.dtype != torch.float16:
        return f"its lm_head is {weight.dtype}; the kernels take float16 activations"
    if weight.shape[1] % BLOCK_SIZE:
        return f"the hidden size {weight.shape[1]} is not a multiple of {BLOCK_SIZE}"
    if not linear.runs_on(weight):
        return "the plugin's CUDA kernels do not run here"
    if not torch.isfinite(_amax(weight)):
        return "its lm_head holds NaN or Inf"
    return None


class DraftHeadMixin:
    """Put before a vLLM MTP model class: drafts are scored with a quantized copy of the lm_head the model loaded.

    The copy is made in ``load_weights``, where the MTP model still holds the checkpoint's lm_head (vLLM's proposer
    replaces it with the main model's, the same tensor, right after), so its memory is counted before vLLM sizes
    the KV cache."""

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        from vllm_volta_fp4.plugin.compat import plugin_logger
        from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

        logger = plugin_logger(__name__)
        refusal = draft_head_refusal(self, isinstance(self.quant_config, VoltaNvfp4Config))
        if refusal is not None:
            logger.info("volta_nvfp4: MTP drafts use the 16-bit lm_head (%s)", refusal)
            return loaded
        with torch.no_grad():
            self.draft_head = QuantizedDraftHead(self.lm_head.weight, envs.draft_head_format())
        head = self.draft_head
        logger.info("volta_nvfp4: MTP drafts use an %s copy of lm_head (%d × %d, %.2f GB); verification keeps the "
                    "16-bit head, so outputs are unchanged (%s=0 turns the copy off)", head.fmt.upper(), *head.shape,
                    head.bytes() / 1e9, envs.DRAFT_HEAD.name)
        return loaded

    def compute_logits(self, hidden_states: torch.Tensor, *args, **kwargs):
        head = self._modules.get("draft_head")  # registered by load_weights, or absent
        if head is None:
            return super().compute_logits(hidden_states, *args, **kwargs)
        return self.logits_processor(head, hidden_states)
