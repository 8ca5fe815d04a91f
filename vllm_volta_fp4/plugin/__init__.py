"""vLLM glue: the ``volta_nvfp4`` quantization config, its linear methods, the Volta attention backend, (on
compute capability 7.x) the GDN layer on our Gated DeltaNet kernels, and the MTP drafter's quantized lm_head copy.
Imported only when vLLM is."""

from __future__ import annotations


def register_with_vllm() -> None:
    from vllm_volta_fp4.plugin.attention.backend import register_attention_backend
    from vllm_volta_fp4.plugin.compat import register_quantization_config
    from vllm_volta_fp4.plugin.gdn_layer import register_gdn
    from vllm_volta_fp4.plugin.models import register_models
    from vllm_volta_fp4.plugin.quantization.config import NAME, VoltaNvfp4Config

    register_quantization_config(NAME)(VoltaNvfp4Config)
    register_attention_backend()  # vLLM's CUSTOM slot: --attention-backend CUSTOM
    register_gdn()  # compute capability 7.x unless VLLM_VOLTA_FP4_GDN says otherwise
    register_models()  # Qwen3_5MTP drafts with a quantized lm_head copy when volta_nvfp4 serves it
