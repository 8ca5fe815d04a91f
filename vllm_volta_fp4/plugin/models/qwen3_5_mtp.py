"""vLLM's Qwen3.5 MTP draft model with its 16-bit weights quantized and a quantized copy of lm_head for its drafts
(draft_weights.py). vLLM's model registry imports this module only when it builds a Qwen3_5MTP drafter."""

from __future__ import annotations

from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP

from vllm_volta_fp4.plugin.models.draft_weights import DraftWeightsMixin


class VoltaQwen3_5MTP(DraftWeightsMixin, Qwen3_5MTP):
    pass
