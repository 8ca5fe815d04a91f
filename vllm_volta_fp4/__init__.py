"""vllm-volta-fp4: serve NVFP4 checkpoints with stock vLLM on V100 (sm_70) GPUs.

Importing this package needs no vLLM; ``register()`` is the ``vllm.general_plugins`` entry point."""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logger = logging.getLogger("vllm_volta_fp4")

_registered = False


def register() -> None:
    """Register the ``volta_nvfp4`` quantization method with vLLM. Safe to call any number of times."""
    global _registered
    if _registered:
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        logger.info("vllm_volta_fp4: vLLM is not installed; nothing to register")
        return
    from vllm_volta_fp4.plugin import register_with_vllm

    register_with_vllm()
    _registered = True
