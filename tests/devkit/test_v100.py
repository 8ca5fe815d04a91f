"""The V100 performance model's arithmetic (devkit/v100.py): occupancy rules and the tensor-core rate."""

from __future__ import annotations

import pytest

from devkit import v100


def test_tensor_rate_reproduces_the_125_tflops_peak():
    assert v100.MMA_PER_SM_PER_CLOCK == pytest.approx(0.5, rel=0.01)  # 8 tensor cores × 64 MACs / 1024 MACs
    assert v100.MMA_PER_SECOND * 2 * v100.MMA_M8N8K4_MACS == pytest.approx(v100.TENSOR_PEAK_FLOPS)


@pytest.mark.parametrize(("registers", "threads", "smem", "expected"), [
    (32, 128, 0, (16, "threads")),  # 2048 threads / 128
    (123, 128, 0, (4, "registers")),  # 128 registers per thread → 4096 per warp → 16 warps
    (168, 128, 69648, (1, "shared memory")),  # 70 KB: one block in 96 KB
    (96, 128, 43536, (2, "shared memory")),
    (16, 32, 0, (32, "blocks")),
])
def test_occupancy(registers, threads, smem, expected):
    assert v100.occupancy(registers, threads, smem) == expected


def test_served_linears_fuse_the_projections():
    from vllm_volta_fp4.toolkit.planner import model_shape, read_config

    config, where = read_config("tests/data/qwen3.8-27b-config.json")
    layers = v100.served_linears(model_shape(config, where))
    assert layers["full"]["qkv_proj"] == (24 * 256 * 2 + 2 * 4 * 256, 5120)  # the output gate rides on q_proj
    assert layers["linear"]["in_proj_qkvz"] == (2 * 16 * 128 + 2 * 48 * 128, 5120)
    assert layers["full"]["gate_up_proj"] == (2 * 17408, 5120)
    assert layers["head"]["lm_head"] == (248320, 5120)
