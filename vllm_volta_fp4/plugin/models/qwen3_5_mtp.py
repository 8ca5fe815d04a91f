"""vLLM's Qwen3.5 MTP draft model, drafting with the NVFP4 copy of lm_head (draft_head.py). vLLM's model registry
imports this module only when it builds a Qwen3_5MTP drafter."""

from __future__ import annotations

from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP

from vllm_volta_fp4.plugin.models.draft_head import DraftHeadMixin


class VoltaQwen3_5MTP(DraftHeadMixin, Qwen3_5MTP):
    pass
