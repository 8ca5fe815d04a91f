"""FP8 E4M3 weights of mixed FP8+NVFP4 checkpoints, fp16 activations (W8A16; Volta has no FP8 arithmetic)."""

from __future__ import annotations

import torch

from vllm_volta_fp4.format.checkpoint import COMPRESSED_TENSORS
from vllm_volta_fp4.format.nvfp4 import fp8_linear_reference
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.plugin.compat import (
    ChannelQuantScaleParameter,
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
class Fp8LinearMethod(QuantizedLinearMethod):
    prepare = staticmethod(linear.prepare_fp8)
    kernel = staticmethod(linear.fp8_linear)
    reference = staticmethod(fp8_linear_reference)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        loader = extra_weight_attrs["weight_loader"]
        rows, shards = sum(output_partition_sizes), len(output_partition_sizes)
        layer.volta_partition_sizes = list(output_partition_sizes)
        weight, scale_name = self.names["weight"], self.names["scale"]
        layer.register_parameter(weight, ModelWeightParameter(
            data=torch.empty(rows, input_size_per_partition, dtype=torch.float8_e4m3fn),
            input_dim=1, output_dim=0, weight_loader=tracked(layer, weight, shards, loader)))
        if self.scheme.per_channel:
            # compressed-tensors stores channel scales as [N, 1]
            shape = (rows, 1) if self.quant_format.producer == COMPRESSED_TENSORS else (rows,)
            scale = ChannelQuantScaleParameter(data=torch.zeros(shape, dtype=torch.float32), output_dim=0,
                                               weight_loader=tracked(layer, scale_name, shards, loader))
        else:
            scale = per_shard_scale(layer, scale_name, shards, loader)
        layer.register_parameter(scale_name, scale)
        if self.scheme.quantized_activations:
            name = self.names["input_scale"]
            layer.register_parameter(name, per_shard_scale(layer, name, shards, loader, required=False))

    def serving_tensors(self, layer) -> dict[str, torch.Tensor]:
        stored = getattr(layer, self.names["scale"]).data.reshape(-1)
        scale = checked_scales(stored, self.prefix, f"FP8 weight scale '{self.names['scale']}'")
        if not self.scheme.per_channel:
            scale = expand_to_rows(scale, layer.volta_partition_sizes)
        return {"weight": getattr(layer, self.names["weight"]).data, "scale": scale}
