"""Fixtures shared by the GPU tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def triton_allocator():
    """vLLM's Triton GDN kernels ask Triton for scratch memory; vLLM 0.20 installs an allocator for that, 0.19.1
    relies on its own pinned Triton, which the GPU kit replaces with the machine's newer one."""
    import triton

    if hasattr(triton, "set_allocator"):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
