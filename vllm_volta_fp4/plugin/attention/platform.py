"""vLLM's CUDA platform with one change: when no attention backend was asked for, it picks the VOLTA_HMMA backend
(vLLM's own choice on compute capability 7.x is Triton attention without tensor cores).

Activated by the ``vllm.platform_plugins`` entry point ``platform_choice.volta_platform`` on 7.x GPUs (or any
CUDA GPU with VLLM_VOLTA_FP4_ATTENTION=force); imported only then (vllm.platforms.cuda needs a CUDA build of vLLM)."""

from __future__ import annotations

import logging

from vllm.platforms.cuda import CudaPlatform

from vllm_volta_fp4.plugin.attention.platform_choice import automatic_choice

logger = logging.getLogger("vllm_volta_fp4")


class VoltaCudaPlatform(CudaPlatform):
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        capability = cls.get_device_capability()
        ours = capability is not None and (capability.major == 7 or automatic_choice() == "force")
        if selected_backend is None and ours:
            # Imported here, not at the top: vLLM imports this module while it resolves its platform, before the
            # attention modules our backend builds on can be imported.
            from vllm_volta_fp4.plugin.attention.backend import VoltaAttentionBackend, register_attention_backend
            from vllm_volta_fp4.plugin.attention.compat import AttentionBackendEnum

            register_attention_backend()
            reasons = VoltaAttentionBackend.validate_configuration(device_capability=capability,
                                                                   **attn_selector_config._asdict())
            if not reasons:
                logger.info("vllm_volta_fp4: using the VOLTA_HMMA attention backend (CUSTOM)")
                return AttentionBackendEnum.CUSTOM.get_path()
            logger.info("vllm_volta_fp4: VOLTA_HMMA attention does not fit this layer (%s); vLLM chooses",
                        ", ".join(reasons))
        return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
