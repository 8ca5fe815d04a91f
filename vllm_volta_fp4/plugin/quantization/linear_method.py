"""What the NVFP4 and FP8 linear methods share: checked scales across fused shards, the switch from checkpoint
tensors to serving tensors after loading, and the choice between the CUDA kernels and the reference."""

from __future__ import annotations

import torch
from torch.nn import Parameter

from vllm_volta_fp4.format.checkpoint import LayerScheme, QuantFormat
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.compat import LinearMethodBase, PerTensorScaleParameter

PREPARED_PREFIX = "volta_"


# vLLM's shard ids of the q, k and v projections fused into one QKVParallelLinear; merged layers use 0, 1, ...
_QKV_SHARDS = {"q": 0, "k": 1, "v": 2}


def _shard_indices(shard_id, shards: int) -> set[int]:
    """The fused shards one weight-loader call fills: all of them for an unfused (or already fused) tensor, one for
    a shard id, several for a tuple (Qwen3.5's in_proj_qkv → shards 0, 1, 2 of in_proj_qkvz)."""
    if shard_id is None:
        return set(range(shards))
    ids = shard_id if isinstance(shard_id, tuple) else (shard_id,)
    return {_QKV_SHARDS.get(one, one) for one in ids}


def tracked(layer, name: str, shards: int, weight_loader, *, required: bool = True):
    """``weight_loader`` that also records, on ``layer.volta_loaded[name]``, which fused shards the checkpoint really
    filled, so that after loading a tensor it never provided is an error, whatever its memory holds."""
    if not hasattr(layer, "volta_loaded"):
        layer.volta_loaded, layer.volta_required = {}, {}
    layer.volta_loaded[name] = set()
    if required:
        layer.volta_required[name] = shards

    def load(param, loaded_weight, shard_id=None):
        if shard_id is None:
            weight_loader(param, loaded_weight)
        else:
            weight_loader(param, loaded_weight, shard_id)
        layer.volta_loaded[name].update(_shard_indices(shard_id, shards))

    return load


def check_loaded(layer, prefix: str) -> None:
    """Raise when a required checkpoint tensor (or one fused shard of it) was never loaded."""
    for name, shards in getattr(layer, "volta_required", {}).items():
        missing = sorted(set(range(shards)) - layer.volta_loaded[name])
        if missing:
            which = "" if shards == 1 else f" (fused shard{'s' if len(missing) > 1 else ''} {missing} of {shards})"
            raise ValueError(f"volta_nvfp4: tensor '{prefix}.{name}'{which} was never loaded from the checkpoint. The "
                             "checkpoint is incomplete; run `volta-fp4 inspect` on it")


def per_shard_scale(layer, name: str, shards: int, weight_loader, *, required: bool = True) -> PerTensorScaleParameter:
    """One per-tensor scale per fused shard, tracked as loaded shard by shard. A checkpoint tensor that spans several
    shards arrives with a tuple shard id; vLLM 0.19.1 and 0.20 then write its scale into slot 0 only (0.32 fills
    every slot), so each shard it covers is loaded here."""

    def load(param, loaded_weight, shard_id=None):
        if shard_id is None:
            return weight_loader(param, loaded_weight)
        for shard in shard_id if isinstance(shard_id, tuple) else (shard_id,):
            weight_loader(param, loaded_weight, shard)

    return PerTensorScaleParameter(data=torch.zeros(shards, dtype=torch.float32),
                                   weight_loader=tracked(layer, name, shards, load, required=required))


def checked_scales(values: torch.Tensor, prefix: str, what: str) -> torch.Tensor:
    """``values`` as float32 after checking every one is usable (whether they were loaded is check_loaded's)."""
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
        check_loaded(layer, self.prefix)
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
