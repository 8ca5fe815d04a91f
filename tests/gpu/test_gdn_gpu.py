"""The CUDA Gated DeltaNet ops against the float64 references of vllm_volta_fp4/ops/gdn.py, on the device.

Every case draws fresh random inputs, poisons the outputs with NaN and leaves the state slots no sequence owns at
NaN, runs one op (the chunked prefill with one MMA atom), then checks that every output was written, nothing is
NaN, the unowned slots are untouched, and ‖got − ref‖ / ‖ref‖ and the largest error against the float64 reference
computed from the same fp16 inputs. Skipped without CUDA or without the built extension."""

from __future__ import annotations

import pytest
import torch

from devkit.random_batches import RandomGdnBatch
from vllm_volta_fp4.ops import gdn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gdn.kernels_available(), reason="needs CUDA and vllm_volta_fp4._C with the GDN ops"),
]

# Chunked prefill: T, W, U', P, U and the state copy the products read are rounded to fp16 once each; emulating
# those roundings on the CPU gives ‖err‖/‖ref‖ ≈ 5e-4 and max err ≈ 1e-3 · max|ref| on these inputs.
PREFILL_REL_TOL = 3e-3
PREFILL_MAX_TOL = 5e-3  # of max |ref|
# Decode, conv, norms: fp32 arithmetic, one fp16 rounding of the result (2^-11 relative).
ROUNDED_ONCE_REL_TOL = 1e-3

ATOMS = [70, 80]
STATE_DTYPES = [torch.float32, torch.float16]
BATCHES = {
    "one-token": [1],
    "odd": [1, 63, 64, 65, 130, 7],
    "long": [1000],
    "many": [33] * 20,
}


def _atoms() -> list[int]:
    return ATOMS if torch.cuda.get_device_capability()[0] >= 8 else [70]


def _check(name: str, got: torch.Tensor, ref: torch.Tensor, rel_tol: float, max_tol: float) -> None:
    got, ref = got.cpu().double(), ref.cpu().double()
    assert not got.isnan().any(), f"{name}: {int(got.isnan().sum())} of {got.numel()} NaN (unwritten?)"
    scale = float(ref.norm())
    rel = float((got - ref).norm()) / scale if scale else float((got - ref).norm())
    max_abs = float((got - ref).abs().max())
    ref_max = float(ref.abs().max())
    print(f"{name}: rel {rel:.2e}, max abs {max_abs:.2e} (max |ref| {ref_max:.2e})")
    assert rel < rel_tol and max_abs <= max_tol * max(ref_max, 1e-3), (name, rel, max_abs, ref_max)


def _check_states(name: str, got: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, owned: torch.Tensor,
                  rel_tol: float) -> None:
    """The owned slots against the reference; every other slot exactly as it was (NaN for most)."""
    got, ref, owned_slots = got.cpu(), ref.cpu(), owned.cpu().long()
    unowned = torch.ones(got.shape[0], dtype=torch.bool)
    unowned[owned_slots] = False
    untouched = got[unowned].to(before.dtype)
    assert torch.equal(untouched.isnan(), before[unowned].isnan()), f"{name}: a slot no sequence owns was written"
    assert torch.equal(untouched.nan_to_num(), before[unowned].nan_to_num()), f"{name}: an unowned slot changed"
    _check(name, got[owned_slots].double(), ref[owned_slots], rel_tol, 5 * rel_tol)


def _reference_prefill(batch: RandomGdnBatch, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, state) of the float64 reference, run on the GPU in its chunked form (equal to the token-by-token
    definition: tests/test_gdn_reference.py), so that the oracle takes milliseconds instead of CPU seconds."""
    f64 = {n: getattr(batch, n).cuda().double() for n in ("q", "k", "v", "g", "beta", "state")}
    out = gdn.reference_chunk_gated_delta_rule(f64["q"], f64["k"], f64["v"], f64["g"], f64["beta"], f64["state"],
                                               batch.state_indices, batch.cu_seqlens, batch.has_initial_state,
                                               chunk_size=64, **kwargs)
    return out, f64["state"]


def _prefill_case(name: str, lengths: list[int], k_heads: int, v_heads: int, head_dim: int, mma: int,
                  state_dtype: torch.dtype, *, has_initial: list[bool] | None = None, l2norm: bool = False,
                  null_slot: int = -1, padded: list[int] = (), seed: int = 0):
    if mma and mma not in _atoms():
        pytest.skip(f"the SM{mma} atom needs a newer GPU")
    batch = RandomGdnBatch(lengths, k_heads, v_heads, head_dim, state_dtype=state_dtype,
                               has_initial=has_initial, normalised=not l2norm, seed=seed)
    for seq in padded:
        batch.state_indices[seq] = null_slot
    ref, ref_state = _reference_prefill(batch, use_qk_l2norm=l2norm, null_slot=null_slot)
    cuda = {n: getattr(batch, n).cuda() for n in ("q", "k", "v", "g", "beta", "state", "state_indices", "cu_seqlens",
                                                  "has_initial_state")}
    out = torch.full(batch.v.shape, float("nan"), dtype=torch.float16, device="cuda")
    gdn.chunk_gated_delta_rule(cuda["q"], cuda["k"], cuda["v"], cuda["g"], cuda["beta"], cuda["state"],
                               cuda["state_indices"], cuda["cu_seqlens"], cuda["has_initial_state"],
                               use_qk_l2norm=l2norm, null_slot=null_slot, mma=mma, out=out)
    torch.cuda.synchronize()
    label = f"prefill {name} H={k_heads} HV={v_heads} D={head_dim} sm{mma} {str(state_dtype)[6:]} state"
    _check(f"{label} out", out, ref, PREFILL_REL_TOL, PREFILL_MAX_TOL)
    owned = batch.state_indices[(batch.state_indices != null_slot) & (batch.state_indices >= 0)]
    _check_states(f"{label} state", cuda["state"], ref_state, batch.state, owned, PREFILL_REL_TOL)


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("batch_name", list(BATCHES))
@pytest.mark.parametrize("head_dim", gdn.HEAD_DIMS)
def test_chunked_prefill(head_dim, batch_name, state_dtype, mma):
    lengths = BATCHES[batch_name]
    has_initial = [i % 3 != 1 for i in range(len(lengths))]
    _prefill_case(batch_name, lengths, 4, 12, head_dim, mma, state_dtype, has_initial=has_initial,
                  seed=head_dim + len(lengths))


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("heads", [(2, 4), (16, 48), (4, 4)], ids=lambda h: f"{h[0]}k{h[1]}v")
def test_chunked_prefill_head_layouts(heads, mma):
    """The tiny model's 2:4, Qwen3.8-27B's 16:48 (one tensor-parallel rank of it has the same ratio) and 1:1."""
    _prefill_case("heads", [100, 17], heads[0], heads[1], 128 if heads[1] == 48 else 64, mma, torch.float32,
                  seed=heads[1])


@pytest.mark.parametrize("mma", ATOMS)
def test_chunked_prefill_l2norm_in_kernel(mma):
    """vLLM 0.19.1 passes raw q, k and use_qk_l2norm_in_kernel=True."""
    _prefill_case("l2norm", [70, 5, 128], 2, 6, 128, mma, torch.float32, l2norm=True, seed=21)


@pytest.mark.parametrize("null_slot", [-1, 0])
def test_chunked_prefill_padding_entries(null_slot):
    """Padding entries (slot -1, or vLLM 0.20.2's null block 0): zero output, their slot untouched."""
    _prefill_case("padding", [20, 70, 9], 2, 4, 64, 0, torch.float32, null_slot=null_slot, padded=[1], seed=22)


@pytest.mark.parametrize("mma", ATOMS)
def test_state_carry_over_pieces_then_decode(mma):
    """A 300-token sequence prefilled in pieces of 100, 77, 1 and 115 tokens (each piece reading the state the
    previous left, as chunked prefill does), then decoded for 4 tokens, against one float64 pass over all 297."""
    if mma not in _atoms():
        pytest.skip(f"the SM{mma} atom needs a newer GPU")
    total, pieces, decode_steps = 297, [100, 77, 1, 115], 4
    batch = RandomGdnBatch([total], 4, 12, 128, has_initial=[False], seed=31)
    ref, ref_state = _reference_prefill(batch)
    state, indices = batch.state.cuda(), batch.state_indices.cuda()
    outs, begin = [], 0
    for i, length in enumerate(pieces):
        end = begin + length
        has_initial = torch.tensor([i > 0], device="cuda")
        outs.append(gdn.chunk_gated_delta_rule(
            batch.q[begin:end].cuda(), batch.k[begin:end].cuda(), batch.v[begin:end].cuda(), batch.g[begin:end].cuda(),
            batch.beta[begin:end].cuda(), state, indices, torch.tensor([0, length], dtype=torch.int32, device="cuda"),
            has_initial, mma=mma))
        begin = end
    for t in range(begin, begin + decode_steps):
        outs.append(gdn.recurrent_gated_delta_rule_decode(
            batch.q[t:t + 1].cuda(), batch.k[t:t + 1].cuda(), batch.v[t:t + 1].cuda(), batch.a[t:t + 1].cuda(),
            batch.b[t:t + 1].cuda(), batch.A_log.cuda(), batch.dt_bias.cuda(), state, indices, use_qk_l2norm=False))
    torch.cuda.synchronize()
    _check(f"pieces+decode sm{mma} out", torch.cat(outs), ref, PREFILL_REL_TOL, PREFILL_MAX_TOL)
    _check_states(f"pieces+decode sm{mma} state", state, ref_state, batch.state, batch.state_indices, PREFILL_REL_TOL)


def test_chunked_prefill_strided_views_of_mixed_qkv():
    """vLLM's q, k, v are views of the conv output mixed_qkv [tokens, (2H + HV) · D]; out may be a view too."""
    batch = RandomGdnBatch([90, 40], 2, 6, 64, seed=41)
    tokens, hk = batch.q.shape[0], 2 * 64
    mixed = torch.cat([batch.q.flatten(1), batch.k.flatten(1), batch.v.flatten(1)], dim=1).cuda()
    q = mixed[:, :hk].view(tokens, 2, 64)
    k = mixed[:, hk:2 * hk].view(tokens, 2, 64)
    v = mixed[:, 2 * hk:].view(tokens, 6, 64)
    ref, ref_state = _reference_prefill(batch)
    state = batch.state.cuda()
    wide_out = torch.full((tokens, 8, 64), float("nan"), dtype=torch.float16, device="cuda")
    out = gdn.chunk_gated_delta_rule(q, k, v, batch.g.cuda(), batch.beta.cuda(), state, batch.state_indices.cuda(),
                                     batch.cu_seqlens.cuda(), out=wide_out[:, 1:7])
    torch.cuda.synchronize()
    _check("strided views out", out, ref, PREFILL_REL_TOL, PREFILL_MAX_TOL)
    assert wide_out[:, 0].isnan().all() and wide_out[:, 7].isnan().all()  # nothing outside the view
    _check_states("strided views state", state, ref_state, batch.state, batch.state_indices, PREFILL_REL_TOL)


@pytest.mark.parametrize("l2norm", [True, False])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", gdn.HEAD_DIMS)
@pytest.mark.parametrize("batch_size", [1, 8, 33])
def test_recurrent_decode(batch_size, head_dim, state_dtype, l2norm):
    batch = RandomGdnBatch([1] * batch_size, 4, 12, head_dim, state_dtype=state_dtype, normalised=not l2norm,
                               seed=batch_size + head_dim)
    if batch_size > 1:
        batch.state_indices[1] = -1  # a padded entry
    ref_state = batch.state.cuda().double()
    ref = gdn.reference_recurrent_decode(batch.q.cuda(), batch.k.cuda(), batch.v.cuda(), batch.a.cuda(),
                                         batch.b.cuda(), batch.A_log.cuda(), batch.dt_bias.cuda(), ref_state,
                                         batch.state_indices, use_qk_l2norm=l2norm)
    state = batch.state.cuda()
    out = torch.full(batch.v.shape, float("nan"), dtype=torch.float16, device="cuda")
    gdn.recurrent_gated_delta_rule_decode(batch.q.cuda(), batch.k.cuda(), batch.v.cuda(), batch.a.cuda(),
                                          batch.b.cuda(), batch.A_log.cuda(), batch.dt_bias.cuda(), state,
                                          batch.state_indices.cuda(), use_qk_l2norm=l2norm, out=out)
    torch.cuda.synchronize()
    label = f"decode B={batch_size} D={head_dim} {str(state_dtype)[6:]} l2norm={l2norm}"
    _check(f"{label} out", out, ref, ROUNDED_ONCE_REL_TOL, 4 * ROUNDED_ONCE_REL_TOL)
    owned = batch.state_indices[batch.state_indices >= 0]
    state_tol = ROUNDED_ONCE_REL_TOL if state_dtype == torch.float16 else 1e-5
    _check_states(f"{label} state", state, ref_state, batch.state, owned, state_tol)


@pytest.mark.parametrize("width", gdn.CONV_WIDTHS)
def test_conv1d_prefill_and_decode(width):
    """Varlen prefill (mixed has_initial_state, a padded entry, sequences shorter than the window, longer than a
    segment) on vLLM's transposed conv-state view, then two decode steps; the conv state holds raw inputs, so it
    must match exactly."""
    lengths = [1, 2, 200, 64, 65, 3]
    batch = RandomGdnBatch(lengths, 2, 4, 64, conv_width=width,
                               has_initial=[True, False, True, False, True, True], seed=width)
    batch.state_indices[4] = -1
    ref_state = batch.conv_state.clone()
    ref = gdn.reference_causal_conv1d_prefill(batch.conv_x.double(), batch.conv_weight.double(),
                                              batch.conv_bias.double(), ref_state.transpose(1, 2), batch.cu_seqlens,
                                              batch.state_indices, batch.has_initial_state)
    state = batch.conv_state.cuda()
    out = torch.full(batch.conv_x.shape, float("nan"), dtype=torch.float16, device="cuda")
    gdn.causal_conv1d_prefill(batch.conv_x.cuda(), batch.conv_weight.cuda(), batch.conv_bias.cuda(),
                              state.transpose(1, 2), batch.cu_seqlens.cuda(), batch.state_indices.cuda(),
                              batch.has_initial_state.cuda(), out=out)
    torch.cuda.synchronize()
    _check(f"conv prefill width={width}", out, ref, ROUNDED_ONCE_REL_TOL, 4 * ROUNDED_ONCE_REL_TOL)
    assert torch.equal(state.cpu().isnan(), ref_state.isnan())
    assert torch.equal(state.cpu().nan_to_num(), ref_state.nan_to_num())
    for step in range(2):
        x = torch.randn(len(lengths), batch.conv_x.shape[1], generator=torch.Generator().manual_seed(step)).half()
        ref = gdn.reference_causal_conv1d_decode(x.double(), batch.conv_weight.double(), batch.conv_bias.double(),
                                                 ref_state.transpose(1, 2), batch.state_indices)
        out = torch.full(x.shape, float("nan"), dtype=torch.float16, device="cuda")
        gdn.causal_conv1d_decode(x.cuda(), batch.conv_weight.cuda(), batch.conv_bias.cuda(), state.transpose(1, 2),
                                 batch.state_indices.cuda(), out=out)
        torch.cuda.synchronize()
        _check(f"conv decode width={width} step {step}", out, ref, ROUNDED_ONCE_REL_TOL, 4 * ROUNDED_ONCE_REL_TOL)
        assert torch.equal(state.cpu().nan_to_num(), ref_state.nan_to_num())


@pytest.mark.parametrize("head_dim", gdn.HEAD_DIMS)
def test_gated_rms_norm_and_l2norm(head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    x = torch.randn(301, 6, head_dim, generator=gen).half()
    z = torch.randn(301, 6, head_dim, generator=gen).half()
    weight = (1 + 0.1 * torch.randn(head_dim, generator=gen)).half()
    out = gdn.gated_rms_norm(x.cuda(), z.cuda(), weight.cuda(), 1e-6)
    ref = gdn.reference_gated_rms_norm(x.double(), z.double(), weight.double(), 1e-6)
    _check(f"gated rms norm D={head_dim}", out, ref, ROUNDED_ONCE_REL_TOL, 4 * ROUNDED_ONCE_REL_TOL)
    wide = torch.randn(301, 10, head_dim, generator=gen).half().cuda()
    out = gdn.l2norm(wide[:, 2:8])  # a strided view, as q inside mixed_qkv
    _check(f"l2norm D={head_dim}", out, gdn.reference_l2norm(wide[:, 2:8].cpu().double()), ROUNDED_ONCE_REL_TOL,
           4 * ROUNDED_ONCE_REL_TOL)
