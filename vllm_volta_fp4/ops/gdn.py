"""Gated DeltaNet (the linear-attention layers of Qwen3-Next / Qwen3.5 / Qwen3.8): the CUDA ops (csrc/gdn/gdn.cuh,
driver/gdn_driver.cpp) and pure-torch references that are both the CPU fallback and the test oracle.

What one GDN layer computes between its input and output projections, in vLLM's conventions (0.19.1 and 0.20.2):
  1. causal depthwise conv1d (width 4) over the fused q|k|v channels, SiLU, with a per-sequence conv state that
     holds the last ``width - 1`` inputs (oldest first);
  2. gating per token and v-head: ``g = -exp(A_log) * softplus(a + dt_bias)`` (log-decay, <= 0) and
     ``beta = sigmoid(b)``;
  3. the gated delta rule per v-head with a state ``S`` of shape [V, K] (vLLM stores it that way: [slots, HV, V,
     K]); per token, with q and k optionally l2-normalised (eps 1e-6 inside the square root) and q scaled by
     ``scale`` (default K ** -0.5)::

         S <- exp(g_t) * S
         u  = beta_t * (v_t - S k_t)
         S <- S + u k_tᵀ
         o_t = S q_t

     V-head ``hv`` reads k-head ``hv // (HV // H)`` (consecutive v-heads share a k-head);
  4. gated RMSNorm per head: ``rmsnorm(o) * weight * silu(z)`` (norm before gate, no groups).

Batches are varlen: sequence s owns tokens ``cu_seqlens[s] : cu_seqlens[s + 1]`` and the state slot
``state_indices[s]`` of the state caches. A sequence reads its slot only where ``has_initial_state[s]`` (else it
starts from zeros) and always writes its final state back there. A slot that is negative or equal to
``null_slot`` marks a padding entry: nothing is read or written for it and its outputs are zero (vLLM 0.19.1 pads
with -1; vLLM 0.20.2 reserves slot 0 as its null block, so pass ``null_slot=0`` there).

``mma`` picks the MMA atom of the chunked prefill as in vllm_volta_fp4.ops.linear (0 = by compute capability, 70,
80; VLLM_VOLTA_FP4_MMA sets the default). Python never sees a tile shape or the chunk size of the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_volta_fp4.ops import extension

HEAD_DIMS = (64, 128)  # head_k_dim == head_v_dim of the kernels (Qwen3.5/3.8: 128; the tiny test model: 64)
CONV_WIDTHS = (2, 3, 4)
L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
FALLBACK_CHUNK_SIZE = 64  # the CPU fallback runs the chunked formulation: far fewer, larger torch ops


_OPS = extension.OpFamily("gdn_chunked_prefill")


def kernels_available() -> bool:
    """The extension has the GDN ops and a CUDA device is usable."""
    return _OPS.available()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] → [rows, D] with a contiguous last dimension (a view when the strides allow it)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


# ─── Ops (CUDA kernels, else the references) ──────────────────────────────────────────────────────────────────


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dimension (vLLM's fla ``l2norm_fwd``)."""
    if _OPS.runs_on(x) and x.dtype == torch.float16:
        rows = _rows(x)
        out = torch.empty_like(rows)
        torch.ops.volta_fp4.gdn_l2norm(out, rows, float(eps))
        return out.view(x.shape)
    return reference_l2norm(x, eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rmsnorm(x) · weight · silu(z) over the last dimension, in fp32, rounded once (vLLM's ``RMSNormGated`` with
    ``norm_before_gate=True``, no groups, SiLU gate)."""
    if _OPS.runs_on(x, z, weight) and x.dtype == torch.float16:
        rows = _rows(x)
        out = torch.empty_like(rows)
        torch.ops.volta_fp4.gdn_gated_rms_norm(out, rows, _rows(z), weight.to(torch.float16).contiguous(), float(eps))
        return out.view(x.shape)
    return reference_gated_rms_norm(x, z, weight, eps)


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                          query_start_loc: torch.Tensor, cache_indices: torch.Tensor,
                          has_initial_state: torch.Tensor | None, *, activation: str | None = "silu",
                          null_slot: int = -1, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal depthwise conv of the varlen batch ``x`` [tokens, dim] (vLLM's ``causal_conv1d_fn`` on ``x.T``).

    ``weight`` [dim, width]; ``conv_state`` [slots, dim, >= width - 1] (any strides: vLLM's transposed view of its
    (slots, state_len, dim) cache works as is), of which columns 0 … width-2 hold a sequence's last inputs, oldest
    first. Sequence s continues from ``conv_state[cache_indices[s]]`` where ``has_initial_state[s]`` (None = all)
    and leaves its last ``width - 1`` inputs there. Returns ``out`` [tokens, dim] in x's dtype."""
    silu = _check_activation(activation)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if _OPS.runs_on(x, weight, conv_state) and x.dtype == torch.float16:
        torch.ops.volta_fp4.gdn_causal_conv1d_prefill(
            out, x, weight.contiguous(), bias, conv_state, query_start_loc, cache_indices, has_initial_state, silu,
            int(null_slot))
    else:
        out.copy_(reference_causal_conv1d_prefill(x, weight, bias, conv_state, query_start_loc, cache_indices,
                                                  has_initial_state, activation=activation, null_slot=null_slot))
    return out


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                         cache_indices: torch.Tensor, *, activation: str | None = "silu", null_slot: int = -1,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """One new token per sequence, ``x`` [batch, dim]: the conv over the state and x, then the state shifted by
    one (vLLM's ``causal_conv1d_update`` without speculative tokens). Returns ``out`` [batch, dim]."""
    silu = _check_activation(activation)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if _OPS.runs_on(x, weight, conv_state) and x.dtype == torch.float16:
        torch.ops.volta_fp4.gdn_causal_conv1d_decode(out, x, weight.contiguous(), bias, conv_state, cache_indices,
                                                     silu, int(null_slot))
    else:
        out.copy_(reference_causal_conv1d_decode(x, weight, bias, conv_state, cache_indices, activation=activation,
                                                 null_slot=null_slot))
    return out


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor, state_indices: torch.Tensor, cu_seqlens: torch.Tensor,
                           has_initial_state: torch.Tensor | None = None, *, scale: float | None = None,
                           use_qk_l2norm: bool = False, null_slot: int = -1, mma: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule over a varlen prefill batch; returns ``out`` (o [tokens, HV, V]) and updates ``state``
    in place.

    q, k [tokens, H, K]; v [tokens, HV, V] (fp16 on the GPU; token and head strides free, last dim contiguous);
    g (log-decay) and beta [tokens, HV]; state [slots, HV, V, K] float32 or float16. vLLM's
    ``ChunkGatedDeltaRule(q, k, v, g, beta, initial_state, output_final_state=True, cu_seqlens, …)`` is this op
    with ``state=initial_state`` and ``state_indices=arange(N)`` (its final state is then ``initial_state``); on
    the cache itself it replaces the gather / scatter around that call."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device) if out is None else out
    if _OPS.runs_on(q, k, v, state) and q.dtype == torch.float16:
        torch.ops.volta_fp4.gdn_chunked_prefill(
            out, q, k, v, g.float().contiguous(), beta.float().contiguous(), state, state_indices, has_initial_state,
            cu_seqlens, scale, bool(use_qk_l2norm), int(null_slot), extension.default_mma() if mma is None else mma)
    else:
        out.copy_(reference_chunk_gated_delta_rule(q, k, v, g, beta, state, state_indices, cu_seqlens,
                                                   has_initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                                   null_slot=null_slot, chunk_size=FALLBACK_CHUNK_SIZE))
    return out


def recurrent_gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                                      b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                                      state: torch.Tensor, state_indices: torch.Tensor, *, scale: float | None = None,
                                      use_qk_l2norm: bool = True, null_slot: int = -1,
                                      out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per sequence: gating from the raw ``a``, ``b`` [batch, HV] and the layer's ``A_log``,
    ``dt_bias`` [HV], then one delta-rule step on ``state[state_indices[s]]`` in place (vLLM's
    ``fused_sigmoid_gating_delta_rule_update`` with ``inplace_final_state=True`` and one token per sequence, and
    ``fused_recurrent_gated_delta_rule_packed_decode`` when q, k, v are views of its mixed_qkv). q, k
    [batch, H, K], v [batch, HV, V]; returns ``out`` (o [batch, HV, V])."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device) if out is None else out
    if _OPS.runs_on(q, k, v, state) and q.dtype == torch.float16:
        torch.ops.volta_fp4.gdn_recurrent_decode(
            out, q, k, v, a.contiguous(), b.contiguous(), A_log.float().contiguous(), dt_bias.float().contiguous(),
            state, state_indices, scale, bool(use_qk_l2norm), int(null_slot))
    else:
        out.copy_(reference_recurrent_decode(q, k, v, a, b, A_log, dt_bias, state, state_indices, scale=scale,
                                             use_qk_l2norm=use_qk_l2norm, null_slot=null_slot))
    return out


def _check_activation(activation: str | None) -> bool:
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    return activation is not None


# ─── References ───────────────────────────────────────────────────────────────────────────────────────────────


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64 (the tests' oracle), else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _is_padding(slot: int, null_slot: int) -> bool:
    return slot < 0 or slot == null_slot


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) from the raw projections (vLLM's ``fused_gdn_gating``), in float32 (float64 for float64 input)."""
    dtype = _compute_dtype(A_log, a, b, dt_bias)
    x = a.to(dtype) + dt_bias.to(dtype)
    softplus = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
    return -torch.exp(A_log.to(dtype)) * softplus, torch.sigmoid(b.to(dtype))


def reference_l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    xf = x.to(_compute_dtype(x))
    return (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


def reference_gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = _compute_dtype(x, z, weight)
    xf, zf = x.to(dtype), z.to(dtype)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(dtype) * F.silu(zf)).to(x.dtype)


def _conv_sequence(window_inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   silu: bool) -> torch.Tensor:
    """window_inputs [width - 1 + L, dim] (state then new inputs) → [L, dim]: out[t] = Σ_j w[:, j] · in[t + j]."""
    width = weight.shape[1]
    length = window_inputs.shape[0] - (width - 1)
    out = sum(window_inputs[j: j + length] * weight[:, j] for j in range(width))
    if bias is not None:
        out = out + bias
    return F.silu(out) if silu else out


def reference_causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                    conv_state: torch.Tensor, query_start_loc: torch.Tensor,
                                    cache_indices: torch.Tensor, has_initial_state: torch.Tensor | None, *,
                                    activation: str | None = "silu", null_slot: int = -1) -> torch.Tensor:
    silu = _check_activation(activation)
    dtype = _compute_dtype(x, weight, conv_state)
    w = weight.to(dtype)
    bias_c = None if bias is None else bias.to(dtype)
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    width = w.shape[1]
    starts, slots = query_start_loc.tolist(), cache_indices.tolist()
    for seq, slot in enumerate(slots[: len(starts) - 1]):
        if _is_padding(slot, null_slot):
            continue
        begin, end = starts[seq], starts[seq + 1]
        if has_initial_state is None or bool(has_initial_state[seq]):
            prior = conv_state[slot, :, : width - 1].T.to(dtype)
        else:
            prior = torch.zeros(width - 1, x.shape[1], dtype=dtype, device=x.device)
        window_inputs = torch.cat([prior, x[begin:end].to(dtype)])
        out[begin:end] = _conv_sequence(window_inputs, w, bias_c, silu).to(x.dtype)
        conv_state[slot, :, : width - 1] = window_inputs[window_inputs.shape[0] - (width - 1):].T.to(conv_state.dtype)
    return out


def reference_causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                   conv_state: torch.Tensor, cache_indices: torch.Tensor, *,
                                   activation: str | None = "silu", null_slot: int = -1) -> torch.Tensor:
    batch = x.shape[0]
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32)
    return reference_causal_conv1d_prefill(x, weight, bias, conv_state, query_start_loc, cache_indices, None,
                                           activation=activation, null_slot=null_slot)


def gated_delta_rule_by_definition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                   beta: torch.Tensor, state: torch.Tensor,
                                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token. q, k [L, HV, K] (already per v-head and normalised if asked), v [L, HV, V],
    g, beta [L, HV], state [HV, V, K]. Returns (o [L, HV, V], final state); computes in the inputs' dtype."""
    S = state.clone()
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        S = S * torch.exp(g[t])[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", S, k[t]))
        S = S + u[:, :, None] * k[t][:, None, :]
        out[t] = torch.einsum("hvk,hk->hv", S, q[t] * scale)
    return out, S


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, state: torch.Tensor, scale: float,
                             chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as ``gated_delta_rule_by_definition``, chunk by chunk: the formulation the CUDA kernels use.

    Within a chunk (positions t, j; G = running sum of g from the chunk start; S0 the state at its start):
      A = strictly-lower(β_t e^{G_t − G_j} k_t·k_j),  T = (I + A)⁻¹   (the UT transform of the WY representation)
      W = T diag(β e^G) K,  U' = T diag(β) V,  U = U' − W S0ᵀ        (the u_t of all tokens at once)
      O = diag(e^G) Q S0ᵀ · scale + (lower-incl-diag(e^{G_t − G_j} q_t·k_j) · scale) U
      S = e^{G_last} S0 + Uᵀ diag(e^{G_last − G}) K
    Every exponent is ≤ 0, so nothing overflows however strong the decay."""
    S = state.clone()
    out = torch.empty_like(v)
    length, heads = q.shape[0], q.shape[1]
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    for c0 in range(0, length, chunk_size):
        n = min(chunk_size, length - c0)
        qc, kc, vc = (x[c0: c0 + n].transpose(0, 1) for x in (q, k, v))  # [HV, n, ·]
        G = g[c0: c0 + n].T.cumsum(-1)  # [HV, n]
        bc = beta[c0: c0 + n].T
        below = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device), -1)
        diff = G[:, :, None] - G[:, None, :]
        decay_strict = torch.where(below, torch.exp(torch.where(below, diff, 0.0)), 0.0)
        decay_causal = torch.where(below | eye[:n, :n].bool(), torch.exp(torch.where(below, diff, 0.0)), 0.0)
        A = bc[:, :, None] * decay_strict * (kc @ kc.transpose(-1, -2))
        T = torch.linalg.solve_triangular(eye[:n, :n].expand(heads, n, n) + A, eye[:n, :n].expand(heads, n, n),
                                          upper=False, unitriangular=True)
        W = T @ ((bc * torch.exp(G))[:, :, None] * kc)
        U = T @ (bc[:, :, None] * vc) - W @ S.transpose(-1, -2)
        P = decay_causal * (qc @ kc.transpose(-1, -2)) * scale
        O = torch.exp(G)[:, :, None] * (qc @ S.transpose(-1, -2)) * scale + P @ U
        out[c0: c0 + n] = O.transpose(0, 1)
        G_last = G[:, -1]
        U_decayed = U * torch.exp(G_last[:, None] - G)[:, :, None]
        S = torch.exp(G_last)[:, None, None] * S + U_decayed.transpose(-1, -2) @ kc
    return out, S


def reference_chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                     beta: torch.Tensor, state: torch.Tensor, state_indices: torch.Tensor,
                                     cu_seqlens: torch.Tensor, has_initial_state: torch.Tensor | None = None, *,
                                     scale: float | None = None, use_qk_l2norm: bool = False, null_slot: int = -1,
                                     chunk_size: int | None = None) -> torch.Tensor:
    """The op's contract on the reference side: per sequence, by definition (``chunk_size=None``) or chunked."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dtype = _compute_dtype(q, k, v, g, beta, state)
    heads_per_k_head = v.shape[1] // q.shape[1]
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    if use_qk_l2norm:
        q, k = reference_l2norm(q.to(dtype)), reference_l2norm(k.to(dtype))
    starts, slots = cu_seqlens.tolist(), state_indices.tolist()
    for seq, slot in enumerate(slots[: len(starts) - 1]):
        if _is_padding(slot, null_slot):
            continue
        begin, end = starts[seq], starts[seq + 1]
        if has_initial_state is None or bool(has_initial_state[seq]):
            initial = state[slot].to(dtype)
        else:
            initial = torch.zeros(state.shape[1:], dtype=dtype, device=state.device)
        args = [x[begin:end].to(dtype) for x in (q, k)]
        args = [x.repeat_interleave(heads_per_k_head, dim=1) for x in args]
        args += [x[begin:end].to(dtype) for x in (v, g, beta)]
        if chunk_size is None:
            o, final = gated_delta_rule_by_definition(*args, initial, scale)
        else:
            o, final = gated_delta_rule_chunked(*args, initial, scale, chunk_size)
        out[begin:end] = o.to(out.dtype)
        state[slot] = final.to(state.dtype)
    return out


def reference_recurrent_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                               A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                               state_indices: torch.Tensor, *, scale: float | None = None,
                               use_qk_l2norm: bool = True, null_slot: int = -1) -> torch.Tensor:
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    batch = q.shape[0]
    cu_seqlens = torch.arange(batch + 1, dtype=torch.int32)
    return reference_chunk_gated_delta_rule(q, k, v, g, beta, state, state_indices, cu_seqlens, None, scale=scale,
                                            use_qk_l2norm=use_qk_l2norm, null_slot=null_slot)


def _register_fakes() -> None:
    @torch.library.register_fake("volta_fp4::gdn_l2norm")
    def _(out, x, eps):
        return None

    @torch.library.register_fake("volta_fp4::gdn_gated_rms_norm")
    def _(out, x, z, weight, eps):
        return None

    @torch.library.register_fake("volta_fp4::gdn_causal_conv1d_prefill")
    def _(out, x, weight, bias, conv_state, query_start_loc, cache_indices, has_initial_state, silu, null_slot):
        return None

    @torch.library.register_fake("volta_fp4::gdn_causal_conv1d_decode")
    def _(out, x, weight, bias, conv_state, cache_indices, silu, null_slot):
        return None

    @torch.library.register_fake("volta_fp4::gdn_chunked_prefill")
    def _(out, q, k, v, g, beta, state, state_indices, has_initial_state, cu_seqlens, scale, use_qk_l2norm,
          null_slot, mma):
        return None

    @torch.library.register_fake("volta_fp4::gdn_recurrent_decode")
    def _(out, q, k, v, a, b, A_log, dt_bias, state, state_indices, scale, use_qk_l2norm, null_slot):
        return None


_OPS.on_load(_register_fakes)
