"""CPU tests of the attention path: the pure-torch paged reference (the GPU kernels' oracle and CPU fallback)
against plain per-query softmax attention, the KV-cache write, and the vLLM backend (registration, metadata
builder, impl forward on vLLM's own KV layout) running the reference path."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from devkit.random_batches import PersistentAttentionInputs, RandomPagedBatch
from tests.conftest import requires_vllm
from vllm_volta_fp4.ops import attention

# (context_len, query_len) per sequence
BATCHES = {
    "prefill": [(0, 1), (0, 7), (0, 33)],
    "decode": [(0, 1), (15, 1), (16, 1), (70, 1)],
    "chunked-prefill": [(48, 17), (5, 40)],
    "prefix-hit": [(32, 9), (64, 1), (16, 16)],
    "mixed": [(0, 5), (37, 1), (20, 13), (0, 1), (81, 3)],
    "speculative": [(15, 4), (70, 4), (0, 4)],  # K + 1 = 4 tokens per sequence, as MTP verification runs them
}


def naive_attention(batch: RandomPagedBatch, scale: float, window: int) -> torch.Tensor:
    """One query and one head at a time, from the dense keys/values, in float64: the plainest statement."""
    out = torch.empty(batch.query.shape, dtype=torch.float64)
    group = batch.num_heads // batch.num_kv_heads
    token = 0
    for seq, (context, q_len) in enumerate(batch.seqs):
        keys, values = batch.keys[seq].double(), batch.values[seq].double()
        for i in range(q_len):
            pos = context + i
            first = max(0, pos - window + 1) if window else 0
            for head in range(batch.num_heads):
                q = batch.query[token, head].double()
                k, v = keys[first: pos + 1, head // group], values[first: pos + 1, head // group]
                weights = torch.softmax(k @ q * scale, dim=0)
                out[token, head] = weights @ v
            token += 1
    return out


def _check(got: torch.Tensor, ref: torch.Tensor, rel_tol: float) -> None:
    assert not got.isnan().any()
    rel = float((got.double() - ref).norm() / ref.norm())
    assert rel < rel_tol, rel


@pytest.mark.parametrize("window", [0, 1, 5, 40])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (6, 1)], ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_reference_matches_naive_attention(batch_name, block_size, heads, window):
    head_size = 16
    batch = RandomPagedBatch(BATCHES[batch_name], *heads, head_size, block_size,
                                       seed=block_size * 7 + heads[1] + window)
    batch.write_new_tokens()
    if window:
        batch.free_blocks_outside_window(window)
    scale = 1 / math.sqrt(head_size)
    out = torch.full(batch.query.shape, float("nan"), dtype=torch.float64)
    attention.reference_paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                                        batch.seq_lens, scale, window, out=out, compute_dtype=torch.float64)
    _check(out, naive_attention(batch, scale, window), 1e-12)


@pytest.mark.parametrize("head_size", attention.HEAD_SIZES)
def test_fallback_op_matches_dense_reference(head_size):
    batch = RandomPagedBatch(BATCHES["mixed"], 8, 2, head_size, 16, seed=head_size)
    batch.write_new_tokens()
    scale = 1 / math.sqrt(head_size)
    out = attention.paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                                    batch.seq_lens, batch.max_seq_len, scale, 0)
    assert out.dtype == torch.float16
    _check(out, batch.dense_reference(scale), 2e-3)  # fp16 output rounding


def test_write_kv_cache_reference_places_tokens_and_skips_padding():
    batch = RandomPagedBatch(BATCHES["chunked-prefill"], 4, 2, 16, 16, seed=3)
    before = batch.kv_cache.clone()
    slots = torch.cat([batch.slot_mapping, torch.tensor([-1, -1])])
    key = torch.cat([batch.new_key, torch.randn(2, 2, 16).half()])
    value = torch.cat([batch.new_value, torch.randn(2, 2, 16).half()])
    attention.write_kv_cache(key, value, batch.kv_cache, slots)
    for seq, (context, q_len) in enumerate(batch.seqs):
        keys, values = attention.gather_sequence_kv(batch.kv_cache, batch.block_table[seq], context + q_len)
        assert torch.equal(keys, batch.keys[seq]) and torch.equal(values, batch.values[seq])
    changed = ~(batch.kv_cache.isnan() & before.isnan()) & (batch.kv_cache != before)
    assert int(changed.sum()) == 2 * batch.new_key.numel()  # only the new tokens' slots were written


# ─── the vLLM backend on the CPU (reference path) ─────────────────────────────────────────────────────────


@pytest.fixture
def backend_module():
    pytest.importorskip("vllm")
    from vllm_volta_fp4.plugin.attention import backend as attention_backend

    return attention_backend


@requires_vllm
def test_registered_as_custom_backend(backend_module):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend_module.register_attention_backend()
    backend_module.register_attention_backend()  # idempotent
    assert AttentionBackendEnum.CUSTOM.get_class() is backend_module.VoltaAttentionBackend
    assert AttentionBackendEnum[backend_module.VoltaAttentionBackend.get_name()] is AttentionBackendEnum.CUSTOM


@requires_vllm
def test_backend_validation(backend_module):
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    backend = backend_module.VoltaAttentionBackend

    def reasons(**changes):
        config = AttentionSelectorConfig(head_size=256, dtype=torch.float16, kv_cache_dtype="auto", block_size=16)
        return backend.validate_configuration(device_capability=DeviceCapability(7, 0),
                                              **config._replace(**changes)._asdict())

    assert reasons() == []
    assert reasons(block_size=528) == []
    assert reasons(head_size=96) and reasons(dtype=torch.bfloat16) and reasons(kv_cache_dtype="fp8")
    assert reasons(block_size=8) and reasons(has_sink=True)
    assert backend.get_kv_cache_shape(10, 32, 4, 128) == (10, 2, 32, 4, 128)
    with pytest.raises(ValueError):
        backend.get_kv_cache_shape(10, 8, 4, 128)


@requires_vllm
def test_impl_rejects_what_the_kernels_do_not_compute(backend_module):
    impl_cls = backend_module.VoltaAttentionImpl
    impl_cls(8, 128, 0.1, 2, None, 64, "auto")
    for bad in ({"alibi_slopes": [0.1] * 8}, {"logits_soft_cap": 30.0}, {"kv_cache_dtype": "fp8"}):
        args = {"alibi_slopes": None, "sliding_window": None, "kv_cache_dtype": "auto", **bad}
        with pytest.raises(NotImplementedError):
            impl_cls(8, 128, 0.1, 2, **args)
    with pytest.raises(NotImplementedError):
        impl_cls(8, 96, 0.1, 2, None, None, "auto")


def _vllm_layout(kv_cache: torch.Tensor) -> torch.Tensor:
    """Our [nb, 2, bs, h, d] cache in vLLM 0.32's fixed logical layout [nb, h, bs, 2·d] (NHD strides)."""
    keys, values = kv_cache[:, 0], kv_cache[:, 1]  # [nb, bs, h, d]
    return torch.cat([keys, values], dim=-1).transpose(1, 2)


@requires_vllm
@pytest.mark.parametrize("window", [0, 9])
@pytest.mark.parametrize("batch_name", ["mixed", "prefix-hit"])
def test_builder_and_impl_forward(backend_module, batch_name, window):
    from vllm_volta_fp4.plugin.attention import compat

    heads, kv_heads, head_size = 8, 2, 64
    batch = RandomPagedBatch(BATCHES[batch_name], heads, kv_heads, head_size, 16, seed=window + 1)
    tokens = batch.query.shape[0]
    common = compat.CommonAttentionMetadata(
        query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc,
        seq_lens=batch.seq_lens, num_reqs=len(batch.seqs), num_actual_tokens=tokens,
        max_query_len=max(q for _, q in batch.seqs), max_seq_len=batch.max_seq_len,
        block_table_tensor=batch.block_table, slot_mapping=batch.slot_mapping)
    builder = backend_module.VoltaAttentionMetadataBuilder(None, ["layer.0"], None, torch.device("cpu"))
    metadata = builder.build(0, common)
    impl = backend_module.VoltaAttentionImpl(heads, head_size, 1 / math.sqrt(head_size), kv_heads, None,
                                             window or None, "auto")
    kv_cache = batch.kv_cache if compat.BACKEND_DEFINES_KV_LAYOUT else _vllm_layout(batch.kv_cache)
    impl.do_kv_cache_update(None, batch.new_key, batch.new_value, kv_cache, batch.slot_mapping)
    padded_output = torch.full((tokens + 3, heads, head_size), float("nan"), dtype=torch.float16)
    padded_query = torch.cat([batch.query, torch.randn(3, heads, head_size).half()])
    impl.forward(None, padded_query, None, None, kv_cache, metadata, output=padded_output)
    _check(padded_output[:tokens], batch.dense_reference(1 / math.sqrt(head_size), window), 2e-3)
    assert padded_output[tokens:].isnan().all()  # padding rows are not computed
    profiling_output = torch.full_like(padded_output, float("nan"))
    assert impl.forward(None, padded_query, None, None, kv_cache, None, output=profiling_output).eq(0).all()


def graph_config(max_model_len: int = 4096, capture: int = 16, spec_tokens: int = 0, mode: str = "FULL_AND_PIECEWISE"):
    """The parts of a VllmConfig the builder reads for CUDA graphs."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    return SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[mode], max_cudagraph_capture_size=capture,
                                           cudagraph_capture_sizes=[1, 2, 4, 8, capture]),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        speculative_config=SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None)


def common_metadata(views: dict, num_seqs: int, max_query_len: int, max_seq_len: int):
    from vllm_volta_fp4.plugin.attention import compat

    return compat.CommonAttentionMetadata(
        query_start_loc=views["query_start_loc"], query_start_loc_cpu=views["query_start_loc"].cpu(),
        seq_lens=views["seq_lens"], num_reqs=num_seqs, num_actual_tokens=views["query"].shape[0],
        max_query_len=max_query_len, max_seq_len=max_seq_len, block_table_tensor=views["block_table"],
        slot_mapping=views["slot_mapping"])


@requires_vllm
def test_backend_declares_uniform_batch_cuda_graphs(backend_module):
    from vllm_volta_fp4.plugin.attention import compat

    assert backend_module.VoltaAttentionMetadataBuilder._cudagraph_support == compat.AttentionCGSupport.UNIFORM_BATCH
    assert backend_module.graph_batch_limits(graph_config(8192, 32, spec_tokens=2)) == (8192, 3, 32)
    assert backend_module.graph_batch_limits(graph_config(mode="PIECEWISE")) == (0, 0, 0)
    assert backend_module.graph_batch_limits(None) == (0, 0, 0)


@requires_vllm
@pytest.mark.parametrize("seqs, padded_seqs, q_len", [
    ([(15, 1), (70, 1), (0, 1)], 8, 1),  # decode padded to a captured size of 8
    ([(31, 3), (64, 3)], 4, 3),  # speculative decoding: 1 + 2 tokens per sequence
    ([(40, 1)], 1, 1),  # no padding
])
def test_builder_pads_like_vllm_and_keeps_persistent_buffers(backend_module, seqs, padded_seqs, q_len):
    """A graph-shaped batch in persistent buffers, padded as vLLM pads a captured size: the metadata is views of
    those buffers (what a graph replays), the split basis is the engine's max_model_len, and the real tokens'
    output equals the dense reference (padding sequences and tokens are inert)."""
    heads, kv_heads, head_size, block_size = 8, 2, 64, 16
    batch = RandomPagedBatch(seqs, heads, kv_heads, head_size, block_size, seed=len(seqs))
    buffers = PersistentAttentionInputs(16, 64, 8, 32, heads, kv_heads, head_size, block_size)
    tokens, padded_tokens = batch.query.shape[0], padded_seqs * q_len
    buffers.load(batch, padded_seqs, padded_tokens)
    views = buffers.views(padded_seqs, padded_tokens)
    builder = backend_module.VoltaAttentionMetadataBuilder(None, ["layer.0"], graph_config(4096, 16, q_len - 1),
                                                           torch.device("cpu"))
    metadata = builder.build(0, common_metadata(views, padded_seqs, q_len, batch.max_seq_len))
    assert metadata.max_seq_len == 4096
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
        assert getattr(metadata, name).data_ptr() == views[name].data_ptr(), name
    impl = backend_module.VoltaAttentionImpl(heads, head_size, 1 / math.sqrt(head_size), kv_heads, None, None, "auto")
    impl.do_kv_cache_update(None, views["new_key"], views["new_value"], views["kv_cache"], views["slot_mapping"])
    impl.forward(None, views["query"], None, None, views["kv_cache"], metadata, output=views["out"])
    _check(views["out"][:tokens], batch.dense_reference(1 / math.sqrt(head_size)), 2e-3)


@requires_vllm
def test_builder_splits_other_batches_by_their_own_length(backend_module):
    """Prefill-shaped batches (and every batch of an engine without FULL graphs) keep their own max_seq_len."""
    batch = RandomPagedBatch([(20, 5), (3, 1)], 4, 4, 64, 16)
    buffers = PersistentAttentionInputs(4, 16, 4, 16, 4, 4, 64, 16)
    buffers.load(batch, 2, 6)
    views = buffers.views(2, 6)
    common = common_metadata(views, 2, 5, batch.max_seq_len)
    for config in (graph_config(4096, 16), graph_config(mode="PIECEWISE"), None):
        builder = backend_module.VoltaAttentionMetadataBuilder(None, ["layer.0"], config, torch.device("cpu"))
        assert builder.build(0, common).max_seq_len == batch.max_seq_len


def test_platform_plugin_stays_off_without_a_volta_gpu(monkeypatch):
    from vllm_volta_fp4.plugin.attention import platform_choice

    monkeypatch.setattr(platform_choice, "_cuda_capability_major", lambda: 8)
    assert platform_choice.volta_platform() is None
    monkeypatch.setattr(platform_choice, "_cuda_capability_major", lambda: 7)
    assert platform_choice.volta_platform() == platform_choice.PLATFORM
    monkeypatch.setenv(platform_choice.ENABLE_ENV, "0")
    assert platform_choice.volta_platform() is None
    monkeypatch.setenv(platform_choice.ENABLE_ENV, "force")
    monkeypatch.setattr(platform_choice, "_cuda_capability_major", lambda: 9)
    assert platform_choice.volta_platform() == platform_choice.PLATFORM
    monkeypatch.setattr(platform_choice, "_cuda_capability_major", lambda: None)  # no NVIDIA GPU at all
    assert platform_choice.volta_platform() is None


def test_platform_entry_point_imports_nothing_from_vllm():
    """vLLM calls the entry point while importing itself: importing it must not import vLLM (a cycle)."""
    code = ("import sys; from vllm_volta_fp4.plugin.attention import platform_choice; "
            "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_platform_plugin_is_an_installed_entry_point():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="vllm.platform_plugins") if e.name == "volta_attention"]
    assert entry.value == "vllm_volta_fp4.plugin.attention.platform_choice:volta_platform"
