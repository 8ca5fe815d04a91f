"""NVFP4 weights, fp16 activations (W4A16). W4A4 checkpoints run the same way; their input scales are ignored.

Weights stay packed (4 bits + one E4M3 scale per 16) in memory. ``apply`` calls the CUDA kernel when the extension
is built and the layer is on a GPU, otherwise the reference, which dequantizes transiently per call."""

from __future__ import annotations

import torch

from vllm_volta_fp4.format.nvfp4 import BLOCK_SIZE, nvfp4_linear_reference
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.compat import (
    ModelWeightParameter,
    register_weight_loader_v2_supported_method,
)
from vllm_volta_fp4.plugin.quantization.linear_method import (
    QuantizedLinearMethod,
    checked_scales,
    expand_to_rows,
    per_shard_scale,
    tracked,
)


@register_weight_loader_v2_supported_method
class NvFp4LinearMethod(QuantizedLinearMethod):
    prepare = staticmethod(linear.prepare_nvfp4)
    kernel = staticmethod(linear.nvfp4_linear)
    reference = staticmethod(nvfp4_linear_reference)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        if input_size_per_partition % BLOCK_SIZE:
            raise ValueError(
                f"volta_nvfp4: layer '{self.prefix}' has {input_size_per_partition} input features per tensor-parallel "
                f"rank (of {input_size}); NVFP4 needs a multiple of {BLOCK_SIZE}. Use a tensor-parallel size that "
                "divides the input dimension into 16-element blocks")
        loader = extra_weight_attrs["weight_loader"]
        rows, shards = sum(output_partition_sizes), len(output_partition_sizes)
        layer.volta_partition_sizes = list(output_partition_sizes)
        for role, columns, dtype in (("packed", input_size_per_partition // 2, torch.uint8),
                                     ("block_scale", input_size_per_partition // BLOCK_SIZE, torch.float8_e4m3fn)):
            name = self.names[role]
            layer.register_parameter(name, ModelWeightParameter(
                data=torch.empty(rows, columns, dtype=dtype), input_dim=1, output_dim=0,
                weight_loader=tracked(layer, name, shards, loader)))
        name = self.names["global_scale"]
        layer.register_parameter(name, per_shard_scale(layer, name, shards, loader))
        if self.scheme.quantized_activations:  # loaded so the checkpoint loads cleanly, then dropped
            name = self.names["input_scale"]
            layer.register_parameter(name, per_shard_scale(layer, name, shards, loader, required=False))

    def serving_tensors(self, layer) -> dict[str, torch.Tensor]:
        stored = getattr(layer, self.names["global_scale"]).data
        decode = 1.0 / stored if self.quant_format.global_scale_is_inverse else stored
        decode = checked_scales(decode, self.prefix, f"global scale '{self.names['global_scale']}'")
        return {"packed": getattr(layer, self.names["packed"]).data,
                "block_scale": getattr(layer, self.names["block_scale"]).data,
                "global_scale": expand_to_rows(decode, layer.volta_partition_sizes)}
