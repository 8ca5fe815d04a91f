"""Model classes that take the place of vLLM's under the same architecture name. Registered by name, so vLLM
imports them only when it builds that architecture."""

from __future__ import annotations

OVERRIDES = {"Qwen3_5MTP": "vllm_volta_fp4.plugin.models.qwen3_5_mtp:VoltaQwen3_5MTP"}


def register_models() -> None:
    from vllm import ModelRegistry

    for architecture, model_class in OVERRIDES.items():
        ModelRegistry.register_model(architecture, model_class)
