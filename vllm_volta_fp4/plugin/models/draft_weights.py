"""The MTP drafter's weights in FP8 or NVFP4: its own layers quantized in place, and a quantized copy of lm_head.

vLLM's MTP drafter runs its layer(s) and then scores the whole vocabulary with the main model's lm_head for every
draft token. Real exports keep both in 16 bits (ModelOpt excludes "*mtp*" and lm_head): at Qwen3.8-27B's shape one
draft reads the MTP layer and fc (0.85 GB) and the head (248,320 × 5,120, 2.54 GB), so K = 3 drafts read 10 GB per
verification round — on a V100 over half of what the 64-layer decode step itself reads (benchmarks/v100_budget.py).
Drafts only propose tokens; the main model's 16-bit head still scores verification, so the output is token for token
what it is without speculation whatever the drafter's weights: a draft whose argmax moves is at worst a rejected
draft. This module quantizes them once at load and runs them on our weight-only GEMMs:
  * FP8 E4M3 with one scale per row (the default): ~3 % relative weight error, so the drafts' argmax moves only
    where the 16-bit logits nearly tie; half the bytes;
  * NVFP4 (NVIDIA's recipe): ~10 % relative weight error; 28 % of the bytes, more moved drafts.
The MTP layers belong to the drafter alone, so they are replaced (memory goes down); lm_head is the main model's too,
so the drafter gets a copy beside it (memory goes up by the copy). Layers the checkpoint quantized already keep their
method.

DraftWeightsMixin goes in front of vLLM's MTP model class (plugin/models/qwen3_5_mtp.py); it changes nothing unless
the model is served by volta_nvfp4 where the plugin's CUDA kernels run, and VLLM_VOLTA_FP4_DRAFT_WEIGHTS is not off."""

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


def _store_quantized(module: nn.Module, weight: torch.Tensor, fmt: str, prefix: str) -> tuple[str, ...]:
    """Register ``weight``'s ``fmt`` quantization in the kernels' layout as ``module``'s buffers (named ``prefix`` +
    the GEMM's tensor name); the tensor names."""
    prepared = _FORMATS[fmt][0](weight)
    for name, tensor in prepared.items():
        module.register_buffer(prefix + name, tensor, persistent=False)
    return tuple(prepared)


def _buffer_bytes(module: nn.Module, prefix: str, names: tuple[str, ...]) -> int:
    return sum(module._buffers[prefix + name].numel() * module._buffers[prefix + name].element_size()
               for name in names)


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
        self._gemm = _FORMATS[fmt][1]
        self.fmt, self.shape = fmt, tuple(weight.shape)
        # The GEMMs take whole 16-row groups; vLLM pads the head's rows to 64 already, other callers get zero rows
        # that forward cuts off.
        self._extra_rows = -weight.shape[0] % BLOCK_SIZE
        weight = weight.detach()
        if self._extra_rows:  # (never a copy of a real head: 2.5 GB)
            weight = nn.functional.pad(weight, (0, 0, 0, self._extra_rows))
        self.tensor_names = _store_quantized(self, weight, fmt, "")
        self.quant_method = DraftHeadMethod()

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None:
            bias = nn.functional.pad(bias, (0, self._extra_rows))
        logits = self._gemm()(x, {name: getattr(self, name) for name in self.tensor_names}, bias)
        return logits[..., :self.shape[0]] if self._extra_rows else logits

    def bytes(self) -> int:
        return _buffer_bytes(self, "", self.tensor_names)


# Buffers a drafter layer quantized in place holds instead of its weight (apart from vLLM's parameter names).
_LAYER_PREFIX = "volta_draft_"


class DraftLinearMethod:
    """quant_method of a drafter linear layer whose 16-bit weight was replaced by ``fmt`` buffers (vLLM's linear
    layers call ``quant_method.apply(layer, x, bias)``). Not a vLLM QuantizeMethodBase: vLLM's after-loading pass,
    which runs after load_weights, leaves it alone."""

    def __init__(self, fmt: str, tensor_names: tuple[str, ...]):
        self.fmt, self.tensor_names = fmt, tensor_names
        self._gemm = _FORMATS[fmt][1]

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        buffers = layer._buffers  # directly: read on every draft, inside the compiled forward
        return self._gemm()(x, {name: buffers[_LAYER_PREFIX + name] for name in self.tensor_names}, bias)


def quantize_layer_in_place(layer: nn.Module, fmt: str) -> int:
    """Replace ``layer.weight`` by its ``fmt`` quantization in the kernels' layout; the quantized bytes."""
    names = _store_quantized(layer, layer.weight.detach(), fmt, _LAYER_PREFIX)
    del layer.weight  # the 16-bit weight is not kept: the layer is the drafter's alone
    layer.quant_method = DraftLinearMethod(fmt, names)
    return _buffer_bytes(layer, _LAYER_PREFIX, names)


def weight_refusal(weight: object, what: str, *, whole_rows: bool) -> str | None:
    """Why the kernels cannot take ``weight`` (the matrix of ``what``), or None. ``whole_rows``: its rows must come
    in whole 16-row groups too (the head is padded instead)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        return f"{what} has no 16-bit weight matrix"
    if weight.dtype != torch.float16:
        return f"{what} is {weight.dtype}; the kernels take float16 activations"
    if weight.shape[1] % BLOCK_SIZE or (whole_rows and weight.shape[0] % BLOCK_SIZE):
        return f"{what}'s shape {tuple(weight.shape)} is not in whole {BLOCK_SIZE}-element groups"
    if not linear.runs_on(weight):
        return "the plugin's CUDA kernels do not run here"
    if not torch.isfinite(_amax(weight)):
        return f"{what} holds NaN or Inf"
    return None


def draft_weights_refusal(served_by_volta_nvfp4: bool) -> str | None:
    """Why an MTP drafter keeps all its 16-bit weights, whatever they are, or None."""
    if envs.draft_weights_format() is None:
        return f"{envs.DRAFT_WEIGHTS.name} is off"
    if not served_by_volta_nvfp4:
        return "the model is not served by volta_nvfp4"
    return None


def sixteen_bit_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The drafter's linear layers that the checkpoint left unquantized (its MTP layers and fc, as exports ship
    them), by name; lm_head is an embedding, not among them."""
    from vllm_volta_fp4.plugin.compat import LinearBase, UnquantizedLinearMethod

    return {name: module for name, module in model.named_modules()
            if isinstance(module, LinearBase) and isinstance(getattr(module, "quant_method", None),
                                                              UnquantizedLinearMethod)}


class DraftWeightsMixin:
    """Put before a vLLM MTP model class: the drafter's 16-bit linear layers are quantized in place and its drafts
    scored with a quantized copy of the lm_head it loaded.

    Both happen in ``load_weights``, where the MTP model still holds the checkpoint's lm_head (vLLM's proposer
    replaces it with the main model's, the same tensor, right after), so the memory is counted before vLLM sizes
    the KV cache. (The format is part of vLLM's compile cache key: quantization/config.py records it.)"""

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        from vllm_volta_fp4.plugin.compat import plugin_logger
        from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

        logger = plugin_logger(__name__)
        refusal = draft_weights_refusal(isinstance(self.quant_config, VoltaNvfp4Config))
        if refusal is not None:
            logger.info("volta_nvfp4: the MTP drafter keeps its 16-bit weights and lm_head (%s)", refusal)
            return loaded
        fmt = envs.draft_weights_format()
        with torch.no_grad():
            self._quantize_layers(fmt, logger)
            self._copy_head(fmt, logger)
        return loaded

    def _quantize_layers(self, fmt: str, logger) -> None:
        before = after = 0
        kept = []
        for name, layer in sixteen_bit_layers(self).items():
            refusal = weight_refusal(layer.weight, name, whole_rows=True)
            if refusal is not None:
                kept.append(refusal)
                continue
            before += layer.weight.numel() * layer.weight.element_size()
            after += quantize_layer_in_place(layer, fmt)
        if before:
            logger.info("volta_nvfp4: the MTP drafter's 16-bit linear layers are %s now (%.2f GB → %.2f GB)",
                        fmt.upper(), before / 1e9, after / 1e9)
        for refusal in kept:
            logger.info("volta_nvfp4: an MTP drafter layer stays 16-bit: %s", refusal)

    def _copy_head(self, fmt: str, logger) -> None:
        refusal = weight_refusal(getattr(getattr(self, "lm_head", None), "weight", None), "its lm_head",
                                 whole_rows=False)
        if refusal is not None:
            logger.info("volta_nvfp4: MTP drafts use the 16-bit lm_head (%s)", refusal)
            return
        self.draft_head = QuantizedDraftHead(self.lm_head.weight, fmt)
        head = self.draft_head
        logger.info("volta_nvfp4: MTP drafts use an %s copy of lm_head (%d × %d, %.2f GB); verification keeps the "
                    "16-bit head, so outputs are unchanged (%s=0 turns the drafter's quantization off)",
                    head.fmt.upper(), *head.shape, head.bytes() / 1e9, envs.DRAFT_WEIGHTS.name)

    def compute_logits(self, hidden_states: torch.Tensor, *args, **kwargs):
        head = self._modules.get("draft_head")  # registered by load_weights, or absent
        if head is None:
            return super().compute_logits(hidden_states, *args, **kwargs)
        return self.logits_processor(head, hidden_states)
