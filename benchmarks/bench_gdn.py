#!/usr/bin/env python3
"""Gated DeltaNet kernels: ours (SM80 atom; SM70 for reference) vs the pure-torch reference and vLLM's Triton kernels.

vLLM's own Triton/FLA kernels are timed when vLLM is importable, on the same GPU in the same run.

Shapes: one Qwen3.8-27B GDN layer (16 k-heads, 48 v-heads, head dim 128, conv width 4 over 10240 channels).
Prefill: the chunked gated delta rule over 1 × 2048 and 4 × 512 tokens from initial states (the reference: the
chunked float32 formulation, vectorised over heads), plus the conv1d and the gated RMSNorm of the same tokens.
Decode: one token per sequence for batch 1, 8, 32: the gated delta rule with the state cache in float32 and in
fp16 (consecutive calls rotate over disjoint state slots spread over more than 200 MB, so the state comes from
DRAM as in a model), and the conv1d. Outputs are checked against the reference before timing, vLLM's against ours
from the same inputs and states; times are CUDA-event medians after warm-up, of GPU time (launch work hidden).

    python benchmarks/bench_gdn.py --out benchmarks/results/gdn-h200.md --commit <hash>
    PYTHONPATH=/tmp/site-0.20.2:$PYTHONPATH python benchmarks/bench_gdn.py ...   # also vLLM 0.20.2's kernels
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import itertools
from types import SimpleNamespace

import torch
from event_timing import median_ms

from devkit.random_batches import RandomGdnBatch
from vllm_volta_fp4.ops import gdn

K_HEADS, V_HEADS, HEAD_DIM, CONV_WIDTH = 16, 48, 128, 4
PREFILL_BATCHES = [[2048], [512] * 4]
DECODE_BATCHES = [1, 8, 32]
ROTATION_BYTES = 200 * 2**20
QK_L2NORM = True  # the chunked rule normalises q and k in-kernel, as our GDN layer and vLLM 0.19.1's call it
NORM_EPS = 1e-6

# The vLLM functions compared with (same modules in 0.19.1 and 0.20.2), as its GDN layer calls them
# (vllm/model_executor/layers/mamba/gdn_linear_attn.py, _forward_core and _forward_core_decode_non_spec).
VLLM_FUNCTIONS = {
    "chunk_gated_delta_rule": "vllm.model_executor.layers.fla.ops",
    "fused_sigmoid_gating_delta_rule_update": "vllm.model_executor.layers.fla.ops",
    "fused_recurrent_gated_delta_rule_packed_decode": "vllm.model_executor.layers.fla.ops",
    "causal_conv1d_fn": "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    "causal_conv1d_update": "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    "compute_causal_conv1d_metadata": "vllm.v1.attention.backends.utils",
    "rmsnorm_fn": "vllm.model_executor.layers.fla.ops.layernorm_guard",  # what RMSNormGated.forward_cuda calls
}
VLLM_LEGEND = [
    "prefill gated delta rule: FLA `chunk_gated_delta_rule` with a leading batch of 1, cu_seqlens and the "
    "sequences' initial states gathered from the cache, `output_final_state=True`, `use_qk_l2norm_in_kernel=True` "
    "(0.20.2's layer normalises in `fused_post_conv_prep` instead; 0.20.2: chunk_indices / chunk_offsets "
    "precomputed from the CPU cu_seqlens as its metadata builder does). The layer's gather of the initial states "
    "and scatter of the final states around the call are not timed (ours works on the cache in place). On Hopper "
    "0.20.2's layer would take FlashInfer's prefill when installed; a V100 runs this FLA path.",
    "prefill conv1d: `causal_conv1d_fn(x.T, …, metadata)` with the metadata of `compute_causal_conv1d_metadata`.",
    "gated RMSNorm: `rmsnorm_fn` (what `RMSNormGated.forward_cuda` calls).",
    "decode gated delta rule, float32 state only: `fused_sigmoid_gating_delta_rule_update` (in-place final state, "
    "`ssm_state_indices` into the same rotated cache) and `fused_recurrent_gated_delta_rule_packed_decode` (q, k, "
    "v packed in one mixed_qkv row; vLLM's default for decode-only batches).",
    "decode conv1d: `causal_conv1d_update` writes its output over its input x, so it is timed on a scratch copy of "
    "x that each call overwrites (the work does not depend on the values; no copy in the timed call); its check "
    "ran on a fresh copy.",
]


def median_us(fn, repeats: int) -> float:
    return median_ms(fn, repeats, hide_launch=True) * 1000


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def load_vllm() -> SimpleNamespace | None:
    """vLLM's version and the functions of VLLM_FUNCTIONS (None for one it lacks, with a printed reason), or None
    when vLLM is not importable. Imported here, not at module level: without vLLM the benchmark times ours only."""
    try:
        import vllm
    except Exception as error:  # absent, or a build for another platform that fails on import
        print(f"vLLM is not importable ({type(error).__name__}: {error}): timing ours only")
        return None
    found = SimpleNamespace(version=vllm.__version__)
    for name, module in VLLM_FUNCTIONS.items():
        try:
            setattr(found, name, getattr(importlib.import_module(module), name))
        except Exception as error:  # absent in this version, or its module fails to import here
            print(f"vLLM {vllm.__version__}: no {module}.{name} ({type(error).__name__}: {error}); "
                  "its rows go without a vLLM column")
            setattr(found, name, None)
    return found


def vllm_columns(ours_out: torch.Tensor, vllm_out: torch.Tensor, vllm_call, repeats: int) -> dict:
    """vLLM's cells of a row. ``vllm_out`` comes from vLLM's first call on the row's inputs, which also compiles and
    autotunes its Triton kernels; median_us adds 3 untimed warm-up calls before timing ``vllm_call``."""
    return {"vllm_rel": relative_error(vllm_out, ours_out), "vllm_us": median_us(vllm_call, repeats)}


def vllm_chunk_call(vllm: SimpleNamespace, b: RandomGdnBatch):
    """vLLM's FLA chunked rule on b's sequences from their states in ``b.state`` (which it does not write)."""
    initial_state = b.state[b.state_indices.long()]
    initial_state[~b.has_initial_state] = 0
    kwargs = dict(q=b.q[None], k=b.k[None], v=b.v[None], g=b.g[None], beta=b.beta[None], initial_state=initial_state,
                  output_final_state=True, cu_seqlens=b.cu_seqlens, use_qk_l2norm_in_kernel=QK_L2NORM)
    if "chunk_indices" in inspect.signature(vllm.chunk_gated_delta_rule).parameters:  # 0.20+
        from vllm.model_executor.layers.fla.ops.index import prepare_chunk_indices, prepare_chunk_offsets
        from vllm.model_executor.layers.fla.ops.utils import FLA_CHUNK_SIZE

        cu_seqlens = b.cu_seqlens.cpu()
        kwargs.update(chunk_indices=prepare_chunk_indices(cu_seqlens, FLA_CHUNK_SIZE).cuda(),
                      chunk_offsets=prepare_chunk_offsets(cu_seqlens, FLA_CHUNK_SIZE).cuda())
    return lambda: vllm.chunk_gated_delta_rule(**kwargs)[0][0]


def vllm_conv_prefill_call(vllm: SimpleNamespace, b: RandomGdnBatch, conv_state: torch.Tensor):
    nums_dict, batch_ptr, token_chunk_offset_ptr = vllm.compute_causal_conv1d_metadata(
        b.cu_seqlens.cpu(), device=torch.device("cuda"))
    metadata = SimpleNamespace(nums_dict=nums_dict, batch_ptr=batch_ptr,  # the fields it reads of GDNAttentionMetadata
                               token_chunk_offset_ptr=token_chunk_offset_ptr)
    return lambda: vllm.causal_conv1d_fn(
        b.conv_x.T, b.conv_weight, b.conv_bias, activation="silu", conv_states=conv_state.transpose(1, 2),
        has_initial_state=b.has_initial_state, cache_indices=b.state_indices, query_start_loc=b.cu_seqlens,
        metadata=metadata).T


def prefill_rows(lengths: list[int], repeats: int, vllm: SimpleNamespace | None) -> list[dict]:
    b = RandomGdnBatch(lengths, K_HEADS, V_HEADS, HEAD_DIM, conv_width=CONV_WIDTH, device="cuda", seed=len(lengths))
    tokens, label = sum(lengths), f"{len(lengths)}×{lengths[0]}"
    state = b.state.clone()

    def ours(mma: int):
        return lambda: gdn.chunk_gated_delta_rule(b.q, b.k, b.v, b.g, b.beta, state, b.state_indices, b.cu_seqlens,
                                                  b.has_initial_state, use_qk_l2norm=QK_L2NORM, mma=mma)

    def reference():
        return gdn.reference_chunk_gated_delta_rule(b.q, b.k, b.v, b.g, b.beta, state, b.state_indices, b.cu_seqlens,
                                                    b.has_initial_state, use_qk_l2norm=QK_L2NORM, chunk_size=64)

    # Correctness from the same initial state, then time (the state then keeps evolving; the work does not change).
    expected = gdn.reference_chunk_gated_delta_rule(b.q, b.k, b.v, b.g, b.beta, b.state.clone(), b.state_indices,
                                                    b.cu_seqlens, b.has_initial_state, use_qk_l2norm=QK_L2NORM,
                                                    chunk_size=64)
    for mma in (70, 80):  # rel and got end up the SM80 atom's
        got = gdn.chunk_gated_delta_rule(b.q, b.k, b.v, b.g, b.beta, b.state.clone(), b.state_indices, b.cu_seqlens,
                                         b.has_initial_state, use_qk_l2norm=QK_L2NORM, mma=mma)
        rel = relative_error(got, expected)
        assert rel < 3e-3 and not got.isnan().any(), f"prefill {label} sm{mma}: rel error {rel}"
    rows = [{"case": f"prefill {label}: gated delta rule", "tokens": tokens, "ref_us": median_us(reference, repeats),
             "sm80_us": median_us(ours(80), repeats), "sm70_us": median_us(ours(70), repeats), "check": rel}]
    if vllm and vllm.chunk_gated_delta_rule:
        call = vllm_chunk_call(vllm, b)
        rows[-1] |= vllm_columns(got, call(), call, repeats)

    def conv(function, conv_state):
        return lambda: function(b.conv_x, b.conv_weight, b.conv_bias, conv_state.transpose(1, 2), b.cu_seqlens,
                                b.state_indices, b.has_initial_state)

    conv_ours = conv(gdn.causal_conv1d_prefill, b.conv_state.clone())
    conv_reference = conv(gdn.reference_causal_conv1d_prefill, b.conv_state.clone())
    got = conv_ours()  # first calls from the same initial conv state: ours, the reference's and vLLM's
    rel = relative_error(got, conv_reference())
    rows.append({"case": f"prefill {label}: conv1d", "tokens": tokens, "ref_us": median_us(conv_reference, repeats),
                 "sm80_us": median_us(conv_ours, repeats), "sm70_us": None, "check": rel})
    if vllm and vllm.causal_conv1d_fn and vllm.compute_causal_conv1d_metadata:
        call = vllm_conv_prefill_call(vllm, b, b.conv_state.clone())
        rows[-1] |= vllm_columns(got, call(), call, repeats)

    o, z = b.v, torch.randn_like(b.v)
    weight = torch.ones(HEAD_DIM, dtype=torch.float16, device="cuda")
    got = gdn.gated_rms_norm(o, z, weight, NORM_EPS)
    rows.append({"case": f"prefill {label}: gated RMSNorm", "tokens": tokens,
                 "ref_us": median_us(lambda: gdn.reference_gated_rms_norm(o, z, weight, NORM_EPS), repeats),
                 "sm80_us": median_us(lambda: gdn.gated_rms_norm(o, z, weight, NORM_EPS), repeats), "sm70_us": None,
                 "check": relative_error(got, gdn.reference_gated_rms_norm(o, z, weight, NORM_EPS))})
    if vllm and vllm.rmsnorm_fn:
        def vllm_norm():
            return vllm.rmsnorm_fn(o, weight, None, z=z, eps=NORM_EPS, group_size=None, norm_before_gate=True,
                                   activation="swish")
        rows[-1] |= vllm_columns(got, vllm_norm(), vllm_norm, repeats)
    return rows


def vllm_decode_steps(vllm: SimpleNamespace | None, b: RandomGdnBatch) -> dict:
    """{row label: step(cache, slots) → o [batch, HV, V]} for vLLM's decode kernels present (float32 state)."""
    steps = {}
    if vllm and vllm.fused_sigmoid_gating_delta_rule_update:
        cu_seqlens = torch.arange(len(b.lengths) + 1, dtype=torch.int32, device="cuda")

        def fused_sigmoid(cache, slots):
            return vllm.fused_sigmoid_gating_delta_rule_update(
                A_log=b.A_log, a=b.a, b=b.b, dt_bias=b.dt_bias, q=b.q[None], k=b.k[None], v=b.v[None],
                initial_state=cache, inplace_final_state=True, cu_seqlens=cu_seqlens, ssm_state_indices=slots,
                use_qk_l2norm_in_kernel=True)[0][0]
        steps["vLLM fused sigmoid-gating update"] = fused_sigmoid
    if vllm and vllm.fused_recurrent_gated_delta_rule_packed_decode:
        mixed_qkv = torch.cat([b.q.flatten(1), b.k.flatten(1), b.v.flatten(1)], dim=1)
        out = torch.empty(len(b.lengths), 1, V_HEADS, HEAD_DIM, dtype=torch.float16, device="cuda")

        def packed(cache, slots):
            vllm.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=mixed_qkv, a=b.a, b=b.b, A_log=b.A_log, dt_bias=b.dt_bias, scale=b.scale,
                initial_state=cache, out=out, ssm_state_indices=slots, use_qk_l2norm_in_kernel=True)
            return out[:, 0]
        steps["vLLM packed decode"] = packed
    return steps


def decode_rows(batch_size: int, state_dtype: torch.dtype, repeats: int, vllm: SimpleNamespace | None) -> list[dict]:
    """The decode row, or one per vLLM decode kernel compared (float32 state), ours' cells repeated."""
    b = RandomGdnBatch([1] * batch_size, K_HEADS, V_HEADS, HEAD_DIM, state_dtype=state_dtype, device="cuda",
                           seed=batch_size)
    slot_bytes = V_HEADS * HEAD_DIM * HEAD_DIM * b.state.element_size()
    sets = max(2, -(-ROTATION_BYTES // (batch_size * slot_bytes)))
    # Slot 0 stays unused: vLLM 0.20.2's decode kernels skip it as the null block.
    cache = torch.randn(1 + sets * batch_size, V_HEADS, HEAD_DIM, HEAD_DIM, device="cuda").mul_(0.3).to(state_dtype)
    index_sets = (1 + torch.randperm(sets * batch_size, device="cuda")).to(torch.int32).view(sets, batch_size)
    initial_cache = cache.clone()
    args = (b.q, b.k, b.v, b.a, b.b, b.A_log, b.dt_bias)

    def ours(state_cache, slots):
        return gdn.recurrent_gated_delta_rule_decode(*args, state_cache, slots)

    def reference(state_cache, slots):
        return gdn.reference_recurrent_decode(*args, state_cache, slots)

    def rotating(step):
        calls = itertools.count(1)
        return lambda: step(cache, index_sets[next(calls) % sets])

    got = ours(cache, index_sets[0])
    rel = relative_error(got, reference(initial_cache.clone(), index_sets[0]))
    assert rel < 2e-3, f"decode B={batch_size}: rel error {rel}"
    row = {"case": f"decode B={batch_size}, {str(state_dtype)[6:]} state", "tokens": batch_size,
           "ref_us": median_us(rotating(reference), repeats), "sm80_us": median_us(rotating(ours), repeats),
           "sm70_us": None, "check": rel}
    row["note"] = f"{2 * batch_size * slot_bytes / row['sm80_us'] / 1e3:.0f} GB/s state read + write (ours)"
    steps = vllm_decode_steps(vllm, b) if state_dtype == torch.float32 else {}
    return [row | {"case": f"{row['case']}, {label}",
                   **vllm_columns(got, step(initial_cache.clone(), index_sets[0]), rotating(step), repeats)}
            for label, step in steps.items()] or [row]


def conv_decode_row(batch_size: int, repeats: int, vllm: SimpleNamespace | None) -> dict:
    b = RandomGdnBatch([1] * batch_size, K_HEADS, V_HEADS, HEAD_DIM, conv_width=CONV_WIDTH, device="cuda",
                           seed=batch_size)

    def step(function, conv_state):
        return lambda: function(b.conv_x, b.conv_weight, b.conv_bias, conv_state.transpose(1, 2), b.state_indices)

    ours = step(gdn.causal_conv1d_decode, b.conv_state.clone())
    reference = step(gdn.reference_causal_conv1d_decode, b.conv_state.clone())
    got = ours()  # first calls from the same initial conv state: ours, the reference's and vLLM's
    rel = relative_error(got, reference())
    row = {"case": f"decode B={batch_size}: conv1d", "tokens": batch_size, "ref_us": median_us(reference, repeats),
           "sm80_us": median_us(ours, repeats), "sm70_us": None, "check": rel}
    if vllm and vllm.causal_conv1d_update:
        def vllm_update(x, conv_state):  # writes its output over x
            return lambda: vllm.causal_conv1d_update(x, conv_state.transpose(1, 2), b.conv_weight, b.conv_bias,
                                                     "silu", conv_state_indices=b.state_indices)
        check = vllm_update(b.conv_x.clone(), b.conv_state.clone())()
        row |= vllm_columns(got, check, vllm_update(b.conv_x.clone(), b.conv_state.clone()), repeats)
    return row


def table(rows: list[dict], vllm: SimpleNamespace | None, repeats: int, commit: str) -> str:
    against = f" and vLLM {vllm.version}'s Triton kernels" if vllm else ""
    lines = [
        f"# Gated DeltaNet kernels vs the pure-torch reference{against} — {torch.cuda.get_device_name()}",
        "",
        f"{datetime.date.today()}, commit {commit}, torch {torch.__version__}"
        f"{f', vLLM {vllm.version}' if vllm else ''}. One Qwen3.8-27B GDN layer "
        f"({K_HEADS} k-heads, {V_HEADS} v-heads × {HEAD_DIM}, conv width {CONV_WIDTH}); fp16 inputs. Reference: "
        "vllm_volta_fp4/ops/gdn.py on the GPU (chunked float32 formulation for prefill, per-sequence loop for decode). "
        f"Medians of {repeats} event-timed calls after 3 untimed ones, each behind a ~2 ms GPU spin that hides the "
        "host's launch work (as CUDA graphs do): GPU times. Decode rotates over > 200 MB of state slots. The SM70 "
        "atom runs on Hopper in a slow compatibility mode: its column says nothing about a V100.",
    ]
    if vllm:
        lines += ["", "vLLM's kernels run on the same inputs and states as ours; each first ran once untimed for the "
                  "check (Triton compilation and autotuning happen there). vLLM/ours > 1: ours faster. rel. diff = "
                  "‖vLLM − ours‖ / ‖ours‖ of the outputs. Called as vLLM's GDN layer calls them:", ""]
        lines += [f"- {item}" for item in VLLM_LEGEND]
    columns = ["case", "reference µs", "ours SM80 µs", "tokens/s (ours)", "speed-up", "ours SM70 µs",
               "rel. err vs ref"]
    if vllm:
        columns += ["vLLM Triton µs", "vLLM/ours", "rel. diff vs vLLM"]
    lines += ["", "| " + " | ".join(columns + ["note"]) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in rows:
        cells = [r["case"], f"{r['ref_us']:.1f}", f"{r['sm80_us']:.1f}", f"{r['tokens'] / r['sm80_us'] * 1e6:,.0f}",
                 f"{r['ref_us'] / r['sm80_us']:.1f}×", f"{r['sm70_us']:.1f}" if r["sm70_us"] is not None else "—",
                 f"{r['check']:.1e}"]
        if vllm:
            cells += ([f"{r['vllm_us']:.1f}", f"{r['vllm_us'] / r['sm80_us']:.2f}", f"{r['vllm_rel']:.1e}"]
                      if "vllm_us" in r else ["—"] * 3)
        lines.append("| " + " | ".join(cells + [r.get("note", "")]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="uncommitted")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    vllm = load_vllm()
    rows = []

    def add(new_rows: list[dict]) -> None:
        for row in new_rows:
            print(row, flush=True)
        rows.extend(new_rows)

    for lengths in PREFILL_BATCHES:
        add(prefill_rows(lengths, args.repeats, vllm))
    for state_dtype in (torch.float32, torch.float16):
        for batch_size in DECODE_BATCHES:
            add(decode_rows(batch_size, state_dtype, args.repeats, vllm))
    for batch_size in DECODE_BATCHES:
        add([conv_decode_row(batch_size, args.repeats, vllm)])
    text = table(rows, vllm, args.repeats, args.commit)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
