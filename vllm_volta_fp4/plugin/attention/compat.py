"""What differs between vLLM versions for the attention backend (0.19.1 = V100 pin, 0.20.2, 0.32.0).

The names imported here exist in all three; the differences are features, detected by attribute rather than
by version number:
  * KV-cache layout. 0.19.1 / 0.20.2 ask the backend (``get_kv_cache_shape``): we answer
    [num_blocks, 2, block_size, num_kv_heads, head_size]. 0.32 fixes the logical layout itself,
    [num_blocks, num_kv_heads, block_size, 2 · head_size] (K and V concatenated per token), with
    backend-independent strides; ``five_dim_kv_cache`` turns either into our 5-D strided view, so the kernels
    read 0.32's cache in place.
  * ``output``: optional behind ``accept_output_buffer`` in 0.19.1, always passed from 0.20.
  * Validation hooks added later (``supports_sliding_window`` in 0.32, ``get_supported_kernel_block_sizes``
    taking a spec) are plain class methods on the backend; older versions simply do not call them.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import (  # noqa: F401  (re-exported)
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: F401

BACKEND_DEFINES_KV_LAYOUT = hasattr(AttentionBackend, "get_kv_cache_shape")
"""True on 0.19.1 / 0.20.2 (get_kv_cache_shape is ours to answer), False on 0.32 (fixed layout)."""


def five_dim_kv_cache(kv_cache: torch.Tensor, head_size: int) -> torch.Tensor:
    """The layer's KV cache as [num_blocks, 2, block_size, num_kv_heads, head_size] (a view, no copy)."""
    if kv_cache.dim() == 5:
        return kv_cache
    if kv_cache.dim() != 4 or kv_cache.shape[-1] != 2 * head_size:
        raise ValueError(f"unexpected KV cache shape {tuple(kv_cache.shape)} for head_size {head_size}")
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    block_stride, head_stride, slot_stride, _ = kv_cache.stride()
    return kv_cache.as_strided((num_blocks, 2, block_size, num_kv_heads, head_size),
                               (block_stride, head_size, slot_stride, head_stride, 1))
