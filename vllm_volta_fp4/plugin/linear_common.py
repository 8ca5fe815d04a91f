"""What the NVFP4 and FP8 linear methods share: scale bookkeeping across fused shards and kernel dispatch."""

from __future__ import annotations

import torch
from torch.nn import Parameter

PREPARED_PREFIX = "volta_"


def unloaded_sentinel(shape: tuple[int, ...]) -> torch.Tensor:
    """Scales start as NaN so a shard the checkpoint never filled is caught after loading, not served."""
    return torch.full(shape, float("nan"), dtype=torch.float32)


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


def cuda_kernels_for(tensor: torch.Tensor):
    """The CUDA kernel module when the extension is built and ``tensor`` lives on a CUDA device, else None."""
    if not tensor.is_cuda:
        return None
    from vllm_volta_fp4 import kernels

    return kernels if kernels.is_available() else None


def install(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], drop: list[str]) -> None:
    """Replace the checkpoint-layout parameters ``drop`` by the serving tensors (``volta_<name>``)."""
    for name in drop:
        if hasattr(layer, name):
            delattr(layer, name)
    for name, tensor in tensors.items():
        layer.register_parameter(PREPARED_PREFIX + name, Parameter(tensor, requires_grad=False))
    layer.volta_tensor_names = tuple(tensors)


def installed(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: getattr(layer, PREPARED_PREFIX + name) for name in layer.volta_tensor_names}
