"""Fixtures shared by the GPU tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def triton_allocator():
    """vLLM's Triton GDN kernels need a Triton scratch allocator under the GPU kit (greedy.use_torch_allocator_for_triton)."""
    from vllm_volta_fp4.greedy import use_torch_allocator_for_triton

    use_torch_allocator_for_triton()
