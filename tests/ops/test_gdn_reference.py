"""The pure-torch Gated DeltaNet references (vllm_volta_fp4/ops/gdn.py), in float64: the chunked formulation the CUDA
kernels use against the token-by-token definition, state carry-over across pieces and into decode, varlen batches
against one sequence at a time, the conv1d against torch's conv1d, the norms and the gating against their
formulas, and the convention (state layout, scaling, GQA mapping, l2-norm eps) against Hugging Face's Qwen3.5."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from devkit.random_batches import RandomGdnBatch
from vllm_volta_fp4.ops import gdn

F64 = dict(dtype=torch.float64, state_dtype=torch.float64)
EXACT = dict(rtol=1e-10, atol=1e-12)


def _run(batch: RandomGdnBatch, chunk_size: int | None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    state = batch.state.clone()
    out = gdn.reference_chunk_gated_delta_rule(batch.q, batch.k, batch.v, batch.g, batch.beta, state,
                                               batch.state_indices, batch.cu_seqlens, batch.has_initial_state,
                                               chunk_size=chunk_size, **kwargs)
    return out, state


def _assert_states_equal(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal where a sequence wrote, and NaN (untouched) in the slots nobody owns."""
    assert torch.equal(got.isnan(), expected.isnan())
    torch.testing.assert_close(got.nan_to_num(), expected.nan_to_num(), **EXACT)


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64, 100])
@pytest.mark.parametrize("head_dim", gdn.HEAD_DIMS)
def test_chunked_equals_definition(chunk_size, head_dim):
    lengths = [1, 63, 64, 65, 130, 7]
    batch = RandomGdnBatch(lengths, 2, 6, head_dim, has_initial=[True, False, True, True, False, True],
                               seed=chunk_size + head_dim, **F64)
    out_def, state_def = _run(batch, None)
    out_chunked, state_chunked = _run(batch, chunk_size)
    torch.testing.assert_close(out_chunked, out_def, **EXACT)
    _assert_states_equal(state_chunked, state_def)
    assert out_def.abs().max() > 1e-3  # the outputs are not trivially zero


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 150), min_size=1, max_size=4), chunk_size=st.sampled_from([2, 5, 32, 64]),
       group=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**16))
def test_chunked_equals_definition_random_batches(lengths, chunk_size, group, seed):
    gen = torch.Generator().manual_seed(seed)
    has_initial = (torch.rand(len(lengths), generator=gen) < 0.5).tolist()
    batch = RandomGdnBatch(lengths, 2, 2 * group, 16, has_initial=has_initial, seed=seed, **F64)
    out_def, state_def = _run(batch, None)
    out_chunked, state_chunked = _run(batch, chunk_size)
    torch.testing.assert_close(out_chunked, out_def, **EXACT)
    _assert_states_equal(state_chunked, state_def)


def test_strong_decay_does_not_overflow():
    """Decays of e^-50 per token: every exponent the chunked form takes is ≤ 0, so nothing turns inf/NaN."""
    batch = RandomGdnBatch([200], 1, 2, 16, seed=3, **F64)
    batch.g = torch.full_like(batch.g, -50.0)
    out_def, state_def = _run(batch, None)
    out_chunked, state_chunked = _run(batch, 64)
    assert torch.isfinite(out_chunked).all()
    torch.testing.assert_close(out_chunked, out_def, **EXACT)
    _assert_states_equal(state_chunked, state_def)


def _slice_batch(batch: RandomGdnBatch, begin: int, end: int) -> dict[str, torch.Tensor]:
    return {name: getattr(batch, name)[begin:end] for name in ("q", "k", "v", "g", "beta", "a", "b")}


@pytest.mark.parametrize("split", [1, 37, 64, 100])
def test_state_carry_over_two_pieces_equal_one(split):
    """A sequence prefilled in two pieces (the second reading the state the first left) equals one prefill."""
    batch = RandomGdnBatch([150], 2, 4, 32, seed=split, **F64)
    out_whole, state_whole = _run(batch, 64)
    state = batch.state.clone()
    outs = []
    for begin, end in ((0, split), (split, 150)):
        piece = _slice_batch(batch, begin, end)
        outs.append(gdn.reference_chunk_gated_delta_rule(
            piece["q"], piece["k"], piece["v"], piece["g"], piece["beta"], state, batch.state_indices,
            torch.tensor([0, end - begin], dtype=torch.int32), batch.has_initial_state, chunk_size=64))
    torch.testing.assert_close(torch.cat(outs), out_whole, **EXACT)
    _assert_states_equal(state, state_whole)


def test_decode_after_prefill_equals_one_long_prefill():
    """Prefill 70 tokens, then decode 5 tokens one by one (gating from a, b): the same outputs and state as one
    prefill of all 75."""
    batch = RandomGdnBatch([75], 2, 4, 32, seed=5, **F64)
    out_whole, state_whole = _run(batch, 64)
    state = batch.state.clone()
    prefill = _slice_batch(batch, 0, 70)
    outs = [gdn.reference_chunk_gated_delta_rule(prefill["q"], prefill["k"], prefill["v"], prefill["g"],
                                                 prefill["beta"], state, batch.state_indices,
                                                 torch.tensor([0, 70], dtype=torch.int32), chunk_size=64)]
    for t in range(70, 75):
        token = _slice_batch(batch, t, t + 1)
        outs.append(gdn.reference_recurrent_decode(token["q"], token["k"], token["v"], token["a"], token["b"],
                                                   batch.A_log, batch.dt_bias, state, batch.state_indices,
                                                   use_qk_l2norm=False))
    torch.testing.assert_close(torch.cat(outs), out_whole, **EXACT)
    _assert_states_equal(state, state_whole)


def test_varlen_batch_equals_sequences_one_by_one():
    lengths = [5, 64, 1, 90]
    batch = RandomGdnBatch(lengths, 2, 4, 32, has_initial=[False, True, True, False], seed=9, **F64)
    out_batch, state_batch = _run(batch, 64)
    state = batch.state.clone()
    starts = batch.cu_seqlens.tolist()
    for seq in range(len(lengths)):
        piece = _slice_batch(batch, starts[seq], starts[seq + 1])
        out = gdn.reference_chunk_gated_delta_rule(
            piece["q"], piece["k"], piece["v"], piece["g"], piece["beta"], state, batch.state_indices[seq:seq + 1],
            torch.tensor([0, lengths[seq]], dtype=torch.int32), batch.has_initial_state[seq:seq + 1], chunk_size=64)
        torch.testing.assert_close(out, out_batch[starts[seq]:starts[seq + 1]], **EXACT)
    _assert_states_equal(state, state_batch)


def test_initial_state_read_only_where_flagged():
    """has_initial_state False starts from zeros whatever the slot holds (here: NaN)."""
    batch = RandomGdnBatch([20], 1, 2, 16, has_initial=[False], seed=1, **F64)
    batch.state[batch.state_indices.long()] = float("nan")
    out, state = _run(batch, 8)
    assert torch.isfinite(out).all() and torch.isfinite(state[batch.state_indices.long()]).all()


@pytest.mark.parametrize("null_slot", [-1, 0])
def test_padding_entries_are_skipped(null_slot):
    """A sequence whose slot is negative or the null slot: zero output, no state read or written (vLLM 0.19.1 pads
    with -1, 0.20.2 with its null block 0)."""
    batch = RandomGdnBatch([10, 12, 9], 1, 2, 16, seed=2, **F64)
    batch.state_indices[1] = null_slot
    before = batch.state.clone()
    out, state = _run(batch, 4, null_slot=null_slot)
    starts = batch.cu_seqlens.tolist()
    assert torch.equal(out[starts[1]:starts[2]], torch.zeros_like(out[starts[1]:starts[2]]))
    assert out[: starts[1]].abs().max() > 0 and out[starts[2]:].abs().max() > 0
    assert torch.equal(state[null_slot].isnan(), before[null_slot].isnan())
    assert torch.equal(state[null_slot].nan_to_num(), before[null_slot].nan_to_num())


def test_l2norm_in_kernel_equals_normalising_first():
    batch = RandomGdnBatch([40, 3], 2, 4, 32, normalised=False, seed=4, **F64)
    out_in_kernel, state_in_kernel = _run(batch, 16, use_qk_l2norm=True)
    batch.q, batch.k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (batch.q, batch.k))
    out_first, state_first = _run(batch, 16)
    torch.testing.assert_close(out_in_kernel, out_first, **EXACT)
    _assert_states_equal(state_in_kernel, state_first)


def test_convention_matches_hugging_face_qwen3_5():
    """Hugging Face's Qwen3.5 keeps the state as [K, V] (ours and vLLM's: [V, K]), repeats k-heads with
    repeat_interleave, normalises q/k with eps 1e-6 inside the square root and scales q by K^-0.5; it computes in
    float32, hence the tolerance."""
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    batch = RandomGdnBatch([70], 2, 6, 32, normalised=False, seed=6, **F64)
    out, state = _run(batch, None, use_qk_l2norm=True)
    slot = batch.state_indices.long()
    group = 3
    for function in (modeling.torch_recurrent_gated_delta_rule, modeling.torch_chunk_gated_delta_rule):
        hf_out, hf_state = function(
            batch.q[None].repeat_interleave(group, 2), batch.k[None].repeat_interleave(group, 2), batch.v[None],
            g=batch.g[None], beta=batch.beta[None], initial_state=batch.state[slot].transpose(-1, -2).float(),
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(hf_out[0].double(), out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(hf_state[0].transpose(-1, -2).double(), state[slot][0], rtol=1e-4, atol=1e-5)


def test_gating_matches_vllm_formula():
    batch = RandomGdnBatch([30], 1, 4, 16, seed=8, **F64)
    batch.a[0] = 25.0  # past the softplus threshold
    g, beta = gdn.gdn_gating(batch.A_log, batch.a, batch.b, batch.dt_bias)
    expected_g = -batch.A_log.double().exp() * F.softplus(batch.a + batch.dt_bias.double(), beta=1.0, threshold=20.0)
    torch.testing.assert_close(g, expected_g, **EXACT)
    torch.testing.assert_close(beta, batch.b.sigmoid(), **EXACT)
    assert (g <= 0).all()


# ─── conv1d ───────────────────────────────────────────────────────────────────────────────────────────────────


def _torch_conv(x: torch.Tensor, prior: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Independent oracle: depthwise F.conv1d over [prior inputs; x], SiLU. x [L, dim], prior [width-1, dim]."""
    inputs = torch.cat([prior, x]).T[None]  # [1, dim, width-1+L]
    out = F.conv1d(inputs, weight[:, None, :], bias, groups=x.shape[1])
    return F.silu(out[0].T)


@pytest.mark.parametrize("width", gdn.CONV_WIDTHS)
def test_conv1d_prefill_against_torch_conv(width):
    lengths = [1, 2, 70, 5]
    batch = RandomGdnBatch(lengths, 1, 1, 16, conv_width=width, has_initial=[True, False, True, False], seed=width,
                               **F64)
    state = batch.conv_state.clone()
    before = state.clone()
    out = gdn.reference_causal_conv1d_prefill(batch.conv_x, batch.conv_weight, batch.conv_bias, state.transpose(1, 2),
                                              batch.cu_seqlens, batch.state_indices, batch.has_initial_state)
    starts = batch.cu_seqlens.tolist()
    for seq, slot in enumerate(batch.state_indices.tolist()):
        x = batch.conv_x[starts[seq]:starts[seq + 1]]
        prior = before[slot] if batch.has_initial_state[seq] else torch.zeros_like(before[slot])
        torch.testing.assert_close(out[starts[seq]:starts[seq + 1]],
                                   _torch_conv(x, prior, batch.conv_weight, batch.conv_bias), **EXACT)
        expected_state = torch.cat([prior, x])[-(width - 1):]
        assert torch.equal(state[slot], expected_state)
    unowned = [s for s in range(state.shape[0]) if s not in batch.state_indices.tolist()]
    assert state[unowned].isnan().all()


@pytest.mark.parametrize("width", gdn.CONV_WIDTHS)
def test_conv1d_prefill_then_decode_equals_full_conv(width):
    """Prefill 6 tokens, decode 4 one at a time: the same outputs as one conv over all 10 from a zero state."""
    batch = RandomGdnBatch([10], 1, 1, 16, conv_width=width, has_initial=[False], seed=11, **F64)
    state_view = batch.conv_state_view
    outs = [gdn.reference_causal_conv1d_prefill(batch.conv_x[:6], batch.conv_weight, batch.conv_bias, state_view,
                                                torch.tensor([0, 6], dtype=torch.int32), batch.state_indices,
                                                batch.has_initial_state)]
    for t in range(6, 10):
        outs.append(gdn.reference_causal_conv1d_decode(batch.conv_x[t:t + 1], batch.conv_weight, batch.conv_bias,
                                                       state_view, batch.state_indices))
    prior = torch.zeros(width - 1, batch.conv_x.shape[1], dtype=torch.float64)
    torch.testing.assert_close(torch.cat(outs), _torch_conv(batch.conv_x, prior, batch.conv_weight, batch.conv_bias),
                               **EXACT)


def test_conv1d_wider_state_and_padding():
    """A conv state with extra columns (vLLM reserves them for speculative tokens) keeps them; a padding entry is
    skipped."""
    batch = RandomGdnBatch([4, 3], 1, 1, 16, seed=12, **F64)
    slots = batch.conv_state.shape[0]
    state = torch.randn(slots, batch.conv_x.shape[1], 5, dtype=torch.float64)
    before = state.clone()
    indices = batch.state_indices.clone()
    indices[1] = -1
    out = gdn.reference_causal_conv1d_prefill(batch.conv_x, batch.conv_weight, None, state, batch.cu_seqlens, indices,
                                              batch.has_initial_state)
    assert torch.equal(state[:, :, 3:], before[:, :, 3:])
    assert torch.equal(out[4:], torch.zeros_like(out[4:]))
    changed = (state != before).flatten(1).any(1)
    assert changed.tolist() == [s == int(indices[0]) for s in range(slots)]


# ─── norms ────────────────────────────────────────────────────────────────────────────────────────────────────


def test_gated_rms_norm_formula():
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(7, 4, 64, generator=gen, dtype=torch.float64), torch.randn(7, 4, 64, generator=gen,
                                                                                    dtype=torch.float64)
    weight = 1 + 0.1 * torch.randn(64, generator=gen, dtype=torch.float64)
    expected = F.rms_norm(x, (64,), weight, eps=1e-6) * z * torch.sigmoid(z)
    torch.testing.assert_close(gdn.reference_gated_rms_norm(x, z, weight, 1e-6), expected, **EXACT)
    assert torch.equal(gdn.gated_rms_norm(x, z, weight, 1e-6), gdn.reference_gated_rms_norm(x, z, weight, 1e-6))


def test_l2norm_formula():
    x = torch.randn(5, 3, 128, dtype=torch.float64)
    x[0, 0] = 0.0  # eps keeps an all-zero row finite
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(gdn.l2norm(x), expected, **EXACT)
    assert torch.equal(gdn.l2norm(x)[0, 0], torch.zeros(128, dtype=torch.float64))


# ─── the public ops fall back to the references off the GPU ───────────────────────────────────────────────────


def test_ops_fall_back_to_references_on_cpu():
    batch = RandomGdnBatch([9, 70], 2, 4, 64, dtype=torch.float16, seed=13)
    state_op, state_ref = batch.state.clone(), batch.state.clone()
    out_op = gdn.chunk_gated_delta_rule(batch.q, batch.k, batch.v, batch.g, batch.beta, state_op, batch.state_indices,
                                        batch.cu_seqlens, batch.has_initial_state)
    out_ref = gdn.reference_chunk_gated_delta_rule(batch.q, batch.k, batch.v, batch.g, batch.beta, state_ref,
                                                   batch.state_indices, batch.cu_seqlens, batch.has_initial_state,
                                                   scale=1 / math.sqrt(64), chunk_size=gdn.FALLBACK_CHUNK_SIZE)
    assert out_op.dtype == torch.float16 and torch.equal(out_op, out_ref)
    assert torch.equal(state_op.nan_to_num(), state_ref.nan_to_num())
    decode = _slice_batch(batch, 0, 2)
    out = gdn.recurrent_gated_delta_rule_decode(decode["q"], decode["k"], decode["v"], decode["a"], decode["b"],
                                                batch.A_log, batch.dt_bias, state_op, batch.state_indices)
    assert out.shape == decode["v"].shape and torch.isfinite(out).all()
    conv = gdn.causal_conv1d_prefill(batch.conv_x, batch.conv_weight, batch.conv_bias, batch.conv_state_view,
                                     batch.cu_seqlens, batch.state_indices, batch.has_initial_state)
    assert conv.shape == batch.conv_x.shape and torch.isfinite(conv).all()
