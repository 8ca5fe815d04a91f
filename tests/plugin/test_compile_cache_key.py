"""The plugin's settings that change a compiled graph (envs.compile_factors) are part of vLLM's torch.compile cache
key: vLLM hashes VllmConfig into the cache directory, and a graph compiled under other settings must not be loaded
from it (on the H200 an NVFP4 MTP drafter was handed the FP8 drafter's cached graph and failed)."""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm
from tests.plugin.test_draft_weights import fake_linear, volta_config

pytestmark = requires_vllm


def cache_key(monkeypatch, settings: dict[str, str]) -> str:
    """VllmConfig's hash after the config builds a layer's method under ``settings``, as vLLM builds a model."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config

    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    vllm_config = VllmConfig()
    vllm_config.quant_config = volta_config()
    with set_current_vllm_config(vllm_config):
        vllm_config.quant_config.get_quant_method(fake_linear(torch.zeros(32, 64, dtype=torch.float16)), "mtp.fc")
    return vllm_config.compute_hash()


@pytest.mark.parametrize("variable", ["VLLM_VOLTA_FP4_DRAFT_WEIGHTS", "VLLM_VOLTA_FP4_MMA"])
def test_each_graph_setting_changes_the_cache_key(monkeypatch, variable):
    values = {"VLLM_VOLTA_FP4_DRAFT_WEIGHTS": ("fp8", "nvfp4", "0"), "VLLM_VOLTA_FP4_MMA": ("auto", "sm70", "sm80")}
    keys = {cache_key(monkeypatch, {variable: value}) for value in values[variable]}
    assert len(keys) == 3


def test_the_same_settings_give_the_same_key(monkeypatch):
    settings = {"VLLM_VOLTA_FP4_DRAFT_WEIGHTS": "nvfp4", "VLLM_VOLTA_FP4_MMA": "sm70"}
    assert cache_key(monkeypatch, settings) == cache_key(monkeypatch, settings)
