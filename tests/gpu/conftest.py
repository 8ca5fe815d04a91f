"""Fixtures shared by the GPU tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def triton_allocator():
    """vLLM's Triton GDN kernels need a Triton scratch allocator under the GPU kit
    (devkit.engine.use_torch_allocator_for_triton)."""
    from devkit.engine import use_torch_allocator_for_triton

    use_torch_allocator_for_triton()
