"""What the NVFP4 and FP8 linear methods share: checked scales across fused shards, the switch from checkpoint
tensors to serving tensors after loading, and the choice between the CUDA kernels and the reference."""

from __future__ import annotations

import torch
from torch.nn import Parameter

from vllm_volta_fp4.format.checkpoint import LayerScheme, QuantFormat
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.compat import LinearMethodBase, PerTensorScaleParameter

PREPARED_PREFIX = "volta_"


def unloaded_sentinel(shape: tuple[int, ...]) -> torch.Tensor:
    """Scales start as NaN so a shard the checkpoint never filled is caught after loading, not served."""
    return torch.full(shape, float("nan"), dtype=torch.float32)


def per_shard_scale(shards: int, weight_loader) -> PerTensorScaleParameter:
    """One per-tensor scale per fused shard, NaN until loaded. A checkpoint tensor that spans several shards
    (Qwen3.5's in_proj_qkv → shards 0, 1, 2 of in_proj_qkvz) arrives with a tuple shard id; vLLM 0.19.1 and 0.20
    then write its scale into slot 0 only (0.32 fills every slot), so each shard it covers is loaded here."""

    def load(param, loaded_weight, shard_id=None):
        if shard_id is None:
            return weight_loader(param, loaded_weight)
        for shard in shard_id if isinstance(shard_id, tuple) else (shard_id,):
            weight_loader(param, loaded_weight, shard)

    return PerTensorScaleParameter(data=unloaded_sentinel((shards,)), weight_loader=load)


def checked_scales(values: torch.Tensor, prefix: str, what: str) -> torch.Tensor:
    """``values`` as float32 after checking every one was loaded and is usable."""
    if torch.isnan(values).any():
        raise ValueError(f"volta_nvfp4: {what} of layer '{prefix}' was never loaded from the checkpoint "
                         "(a shard is missing)")
    if not (torch.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"volta_nvfp4: {what} of layer '{prefix}' is {values.tolist()}; scales must be finite and "
                         "positive. The checkpoint is damaged; re-quantize this layer")
    return values.to(torch.float32)


def expand_to_rows(per_shard: torch.Tensor, output_partition_sizes: list[int]) -> torch.Tensor:
    """One scale per output row from one per fused shard (q/k/v, gate/up keep their own values exactly)."""
    return per_shard.repeat_interleave(torch.tensor(output_partition_sizes, device=per_shard.device))


def runs_our_kernels(tensor: torch.Tensor) -> bool:
    """The CUDA kernels take ``tensor``: it lives on a CUDA device and the extension is built. Called inside the
    compiled forward (apply): reads a value fixed at import, nothing Dynamo would have to skip."""
    return linear.runs_on(tensor)


class QuantizedLinearMethod(LinearMethodBase):
    """Base of the weight-only methods. A subclass creates the checkpoint-layout parameters and, after loading,
    returns the serving tensors in the order its kernel and its reference take them."""

    # prepare(*serving tensors) -> kernel tensors, once after loading; kernel(x, kernel tensors, bias) per forward;
    # reference(x, *serving tensors, bias) where the kernels do not run. Set by each subclass.
    prepare = None
    kernel = None
    reference = None

    def __init__(self, quant_format: QuantFormat, scheme: LayerScheme, prefix: str):
        self.quant_format = quant_format
        self.scheme = scheme
        self.prefix = prefix
        self.names = quant_format.tensor_names(scheme)

    def serving_tensors(self, layer) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def process_weights_after_loading(self, layer) -> None:
        tensors = self.serving_tensors(layer)
        if runs_our_kernels(next(iter(tensors.values()))):
            tensors = type(self).prepare(*tensors.values())
        for name in self.names.values():  # the checkpoint layout is not kept beside the serving layout
            if hasattr(layer, name):
                delattr(layer, name)
        for name, tensor in tensors.items():
            layer.register_parameter(PREPARED_PREFIX + name, Parameter(tensor, requires_grad=False))
        layer.volta_tensor_names = tuple(tensors)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # _parameters directly: nn.Module.__getattr__ costs ~1 µs a name, and eager engines call apply ~4 times per
        # decoder layer and step
        params = layer._parameters
        tensors = {name: params[PREPARED_PREFIX + name] for name in layer.volta_tensor_names}
        if runs_our_kernels(x):
            return type(self).kernel(x, tensors, bias)
        return type(self).reference(x, *tensors.values(), bias)
