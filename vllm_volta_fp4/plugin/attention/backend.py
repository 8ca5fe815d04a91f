"""The VOLTA_HMMA attention backend: vLLM's paged attention on our HMMA kernels (vllm_volta_fp4.ops.attention).

Registered under vLLM's ``CUSTOM`` backend slot by ``register_attention_backend()`` (called from the general
plugin, so in every vLLM process). Select it explicitly with ``--attention-backend CUSTOM``; on compute capability
7.x the platform plugin (platform_choice.py) picks it when no backend was asked for.

Scope: decoder self-attention, causal, fp16 queries and fp16 KV cache, head_size 64 / 128 / 256, any block
size that is a multiple of 16, sliding window; no ALiBi, logits soft-cap, attention sinks, fp8 KV cache or
cascade attention (vLLM then picks another backend, or reports why ours does not fit when it was asked for).
Without CUDA tensors (CPU tests) the impl runs the pure-torch reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm_volta_fp4.ops import attention
from vllm_volta_fp4.plugin.attention import compat

BACKEND_NAME = "CUSTOM"  # the enum member vLLM looks the backend up by (AttentionBackendEnum[get_name()])


@dataclass
class VoltaAttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens]


class VoltaAttentionMetadataBuilder(compat.AttentionMetadataBuilder[VoltaAttentionMetadata]):
    # Uniform batches (decode; 1 + k tokens per sequence under speculative decoding) run inside vLLM's FULL CUDA
    # graphs. What a graph keeps of a forward: the tensors below, slices of the model runner's persistent buffers
    # (vLLM pads them for a captured size: query_start_loc repeats its last value, seq_lens 0, slots -1, which the
    # kernels skip), and the host values of the launch — the split count, from the launch shape and max_seq_len.
    # Each block divides its own KV tiles among the splits on the device, so a replay at other lengths stays
    # correct; for batches a graph may take, max_seq_len is fixed per engine (max_model_len) so that the captured
    # split count suits long contexts too and eager runs of the same batch split the same way.
    _cudagraph_support: ClassVar = compat.AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.split_basis, self.graph_query_len, self.graph_tokens = graph_batch_limits(vllm_config)

    def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False) -> VoltaAttentionMetadata:
        m = common_attn_metadata
        if not (isinstance(m.causal, bool) and m.causal):
            raise NotImplementedError("the VOLTA_HMMA attention backend computes causal attention only")
        num_seqs = m.num_reqs
        graph_shaped = m.max_query_len <= self.graph_query_len and m.num_actual_tokens <= self.graph_tokens
        return VoltaAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=max(self.split_basis, m.max_seq_len) if graph_shaped else m.max_seq_len,
            query_start_loc=m.query_start_loc[: num_seqs + 1],
            seq_lens=m.seq_lens[:num_seqs],
            block_table=m.block_table_tensor[:num_seqs],
            slot_mapping=m.slot_mapping,
        )


def graph_batch_limits(vllm_config) -> tuple[int, int, int]:
    """(split basis, query length, token count): batches of at most that query length and token count may run in
    a FULL CUDA graph, and then split the KV length as for sequences of ``split basis`` tokens. (0, 0, 0) without
    FULL graphs (eager engines, or no config: tests)."""
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is None or not mode.has_full_cudagraphs():
        return 0, 0, 0
    tokens = getattr(compilation, "max_cudagraph_capture_size", None) or max(compilation.cudagraph_capture_sizes or [0])
    speculative = getattr(vllm_config, "speculative_config", None)
    query_len = 1 + (getattr(speculative, "num_speculative_tokens", None) or 0)
    return int(vllm_config.model_config.max_model_len), query_len, int(tokens)


class VoltaAttentionImpl(compat.AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = compat.AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None,
                 **unsupported) -> None:
        problems = [what for what, present in (
            ("ALiBi", alibi_slopes is not None), ("logits soft-cap", bool(logits_soft_cap)),
            ("attention sinks", sinks is not None),
            (f"attention type {attn_type}", attn_type != compat.AttentionType.DECODER),
            (f"KV cache dtype {kv_cache_dtype}", kv_cache_dtype not in VoltaAttentionBackend.supported_kv_cache_dtypes),
            (f"head_size {head_size}", head_size not in attention.HEAD_SIZES),
            (f"options {sorted(k for k, v in unsupported.items() if v)}", any(unsupported.values())),
        ) if present]
        if problems:
            raise NotImplementedError(f"the VOLTA_HMMA attention backend does not support: {', '.join(problems)}")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.sliding_window = sliding_window or 0
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        if self.kv_sharing_target_layer_name is not None:
            return  # this layer reads another layer's cache, which that layer has written
        tokens = min(key.shape[0], slot_mapping.shape[0])
        attention.write_kv_cache(key[:tokens], value[:tokens], compat.five_dim_kv_cache(kv_cache, self.head_size),
                                 slot_mapping[:tokens])

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: VoltaAttentionMetadata | None, output: torch.Tensor | None = None,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output is None:
            raise ValueError("the VOLTA_HMMA attention backend writes into vLLM's output buffer")
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("the VOLTA_HMMA attention backend does not fuse output quantization")
        if attn_metadata is None:  # profiling run: no cache yet
            return output.fill_(0)
        tokens = attn_metadata.num_actual_tokens
        attention.paged_attention(
            query[:tokens], compat.five_dim_kv_cache(kv_cache, self.head_size), attn_metadata.block_table,
            attn_metadata.query_start_loc, attn_metadata.seq_lens, attn_metadata.max_seq_len, self.scale,
            self.sliding_window, out=output[:tokens].view(tokens, self.num_heads, self.head_size))
        return output


class VoltaAttentionBackend(compat.AttentionBackend):
    accept_output_buffer: bool = True  # read by 0.19.1; later versions always pass the output buffer
    forward_includes_kv_cache_update: bool = False  # vLLM calls do_kv_cache_update before forward
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[VoltaAttentionImpl]:
        return VoltaAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[VoltaAttentionMetadataBuilder]:
        return VoltaAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if block_size % 16:
            raise ValueError(f"block_size must be a multiple of 16, got {block_size}")
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (1, 0, 2, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [compat.MultipleOf(16)]

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        return False

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(attention.HEAD_SIZES)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major >= 7


def register_attention_backend() -> None:
    """Register VoltaAttentionBackend as vLLM's CUSTOM attention backend in this process (idempotent)."""
    compat.register_backend(compat.AttentionBackendEnum.CUSTOM,
                            f"{VoltaAttentionBackend.__module__}.{VoltaAttentionBackend.__qualname__}")
