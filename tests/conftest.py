"""Shared fixtures: tiny NVFP4 checkpoints made here, once per test session."""

from __future__ import annotations

import importlib.util

import pytest

from vllm_volta_fp4.tiny_model import FORMATS, make_tiny_checkpoint

HAS_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{format: path} of tiny Llama-shaped checkpoints in every producer format (same seed, same weights)."""
    root = tmp_path_factory.mktemp("tiny")
    return {fmt: make_tiny_checkpoint(root / fmt, "llama", fmt) for fmt in FORMATS}


@pytest.fixture
def fresh_checkpoint(tmp_path):
    """A factory for a private checkpoint a test may damage."""

    def make(fmt: str = "modelopt-nvfp4", arch: str = "llama"):
        return make_tiny_checkpoint(tmp_path / f"{arch}-{fmt}", arch, fmt)

    return make


@pytest.fixture
def simulated_tp(monkeypatch):
    """Make vLLM's linear layers and parameters believe they are rank ``rank`` of ``size``."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor import parameter
    from vllm.model_executor.layers import linear

    def set_rank(rank: int, size: int) -> None:
        for module in (linear, parameter):
            monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
            monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: size)

    with set_current_vllm_config(VllmConfig()):
        yield set_rank
