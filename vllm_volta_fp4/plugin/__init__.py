"""vLLM glue: the ``volta_nvfp4`` quantization config, its linear methods and the Volta attention backend.
Imported only when vLLM is."""

from __future__ import annotations


def register_with_vllm() -> None:
    from vllm_volta_fp4.plugin.attention_backend import register_attention_backend
    from vllm_volta_fp4.plugin.compat import register_quantization_config
    from vllm_volta_fp4.plugin.config import NAME, VoltaNvfp4Config

    register_quantization_config(NAME)(VoltaNvfp4Config)
    register_attention_backend()  # vLLM's CUSTOM slot: --attention-backend CUSTOM
