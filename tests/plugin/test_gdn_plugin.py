"""vllm_volta_fp4.plugin.gdn_layer on the CPU: VLLM_VOLTA_FP4_GDN and the GPU deciding, registration in vLLM's
out-of-tree
registry (which class vLLM then instantiates), and the argument translation of the three overrides, driven into
the references of vllm_volta_fp4.ops.gdn by forcing the "our kernels run" predicate and checked against a float64
token-by-token oracle written here (the layer core, the chunked rule) or against vLLM's own forward_native (the
gated RMSNorm). The same comparisons against vLLM's Triton path are in tests/gpu/test_gdn_plugin_gpu.py."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from devkit.engine import uninstall_gdn_overrides
from devkit.random_batches import RandomGdnBatch
from tests.conftest import requires_vllm
from vllm_volta_fp4.ops import gdn
from vllm_volta_fp4.plugin import gdn_layer

K_HEADS, V_HEADS, D, WIDTH = 2, 4, 64, 4
CONV_DIM = D * (2 * K_HEADS + V_HEADS)


@pytest.fixture
def force_ours(monkeypatch):
    """Our ops take CPU tensors (they run the references there), as if on CUDA fp16 with the extension."""
    monkeypatch.setattr(gdn_layer, "_our_kernels_run", lambda activations, states=(): True)


# ─── Selection ─────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("value, expected", [(None, "volta"), ("", "volta"), ("1", "volta"), ("ON", "volta"),
                                             (" true ", "volta"), ("force", "force"), ("0", "off"), ("off", "off")])
def test_choice_reads_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(gdn_layer.ENABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(gdn_layer.ENABLE_ENV, value)
    assert gdn_layer.choice() == expected


def test_unknown_value_is_an_error(monkeypatch):
    monkeypatch.setenv(gdn_layer.ENABLE_ENV, "sm70")
    with pytest.raises(ValueError, match="VLLM_VOLTA_FP4_GDN='sm70'"):
        gdn_layer.register_gdn()


def test_disabled_registration_imports_nothing_from_vllm():
    code = ("import os, sys; os.environ['VLLM_VOLTA_FP4_GDN'] = '0'; "
            "from vllm_volta_fp4.plugin import gdn_layer; assert gdn_layer.register_gdn() is False; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@requires_vllm
def test_the_plugin_entry_point_reads_the_switch():
    """vllm_volta_fp4.register() (the vllm.general_plugins entry point) goes through register_gdn()."""
    import os

    code = "import vllm_volta_fp4; vllm_volta_fp4.register()"
    env = {**os.environ, gdn_layer.ENABLE_ENV: "sm70"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0 and "VLLM_VOLTA_FP4_GDN='sm70'" in result.stderr


@pytest.fixture
def registry():
    """vLLM's out-of-tree registry, with our classes removed before and after the test."""
    from vllm.model_executor.custom_op import op_registry_oot

    uninstall_gdn_overrides()
    yield op_registry_oot
    uninstall_gdn_overrides()


@requires_vllm
def test_registration_follows_the_switch_and_the_gpu(monkeypatch, registry):
    from vllm.model_executor.custom_op import CustomOp, PluggableLayer

    from vllm_volta_fp4.plugin import compat

    layer, op, norm = compat.gdn_hook_classes()
    names = {layer.__name__, op.__name__, norm.__name__}
    for value, capability in ((None, None), (None, 90), ("force", None), ("0", 70)):
        if value is None:
            monkeypatch.delenv(gdn_layer.ENABLE_ENV, raising=False)
        else:
            monkeypatch.setenv(gdn_layer.ENABLE_ENV, value)
        monkeypatch.setattr(compat, "device_capability", lambda capability=capability: capability)
        assert gdn_layer.register_gdn() is False, (value, capability)  # not CUDA, not Volta unless forced, off
        assert not names & registry.keys()

    monkeypatch.delenv(gdn_layer.ENABLE_ENV)
    monkeypatch.setattr(compat, "device_capability", lambda: 70)  # the default on a V100
    assert gdn_layer.register_gdn() is True
    assert gdn_layer.register_gdn() is True  # idempotent
    uninstall_gdn_overrides()
    monkeypatch.setenv(gdn_layer.ENABLE_ENV, "force")
    monkeypatch.setattr(compat, "device_capability", lambda: 90)  # forced on another GPU
    assert gdn_layer.register_gdn() is True
    for base, override in ((layer, gdn_layer.GdnLayerOverride), (op, gdn_layer.ChunkGatedDeltaRuleOverride),
                           (norm, gdn_layer.RMSNormGatedOverride)):
        cls = registry[base.__name__]  # vLLM's __new__ looks the in-tree class name up
        assert issubclass(cls, base) and issubclass(cls, override)
        assert cls.name == base.name  # the registered op / layer name is kept
        factory = PluggableLayer if issubclass(base, PluggableLayer) else CustomOp
        assert type(factory.__new__(base)) is cls  # what `base(...)` builds inside vLLM
    assert registry[layer.__name__]._forward_core is gdn_layer.GdnLayerOverride._forward_core
    assert registry[op.__name__].forward is gdn_layer.ChunkGatedDeltaRuleOverride.forward

    uninstall_gdn_overrides()
    assert type(CustomOp.__new__(op)) is op


@requires_vllm
def test_a_class_replaced_by_someone_else_is_left_alone(monkeypatch, registry):
    from vllm_volta_fp4.plugin import compat

    _, op, _ = compat.gdn_hook_classes()
    other = type("OtherChunkGatedDeltaRule", (op,), {})
    registry[op.__name__] = other
    try:
        assert gdn_layer.install() is False
        assert registry[op.__name__] is other
    finally:
        del registry[op.__name__]


@requires_vllm
def test_a_vllm_without_the_hook_is_left_alone(monkeypatch, registry):
    from vllm_volta_fp4.plugin import compat

    before = dict(registry)
    monkeypatch.setattr(compat, "_GDN_LAYER_MODULES", (("vllm.model_executor.layers.no_such_gdn", "Layer"),
                                                       ("vllm.model_executor.layers.layernorm", "RMSNorm")))
    assert compat.gdn_hook_classes() is None  # absent module; a module without ChunkGatedDeltaRule
    monkeypatch.setenv(gdn_layer.ENABLE_ENV, "force")
    monkeypatch.setattr(compat, "device_capability", lambda: 70)
    assert gdn_layer.register_gdn() is False
    assert registry == before


@requires_vllm
def test_compat_knows_the_installed_conventions():
    from vllm.v1.attention.backends import gdn_attn

    from vllm_volta_fp4.plugin import compat

    expected = 0 if hasattr(gdn_attn, "NULL_BLOCK_ID") else -1  # 0.20+ pads with the null block, 0.19.1 with -1
    assert compat.gdn_null_slot() == expected
    assert isinstance(compat.gdn_conv_state_dim_first(), bool)


@requires_vllm
def test_layer_metadata_comes_from_vllms_forward_context():
    from vllm.forward_context import override_forward_context

    metadata = SimpleNamespace()
    with override_forward_context(SimpleNamespace(attn_metadata={"model.layers.3.linear_attn": metadata})):
        assert gdn_layer._layer_metadata("model.layers.3.linear_attn") is metadata
        assert gdn_layer._layer_metadata("model.layers.4.linear_attn") is None
    with override_forward_context(SimpleNamespace(attn_metadata=None)):  # profile run
        assert gdn_layer._layer_metadata("model.layers.3.linear_attn") is None


# ─── The oracle: one GDN layer core in float64, token by token ─────────────────────────────────────────────────


def oracle_core(x, a, b, A_log, dt_bias, weight, conv_cache, ssm_state, starts, slots, has_initial, null_slot,
                dim_first):
    """(out [tokens, HV, D], conv cache, ssm state) after the layer core; conv_cache in vLLM's storage layout."""
    x, a, b, A_log, dt_bias, weight = (t.double() for t in (x, a, b, A_log, dt_bias, weight))
    conv_cache, ssm_state = conv_cache.clone(), ssm_state.clone()
    out = torch.zeros(x.shape[0], V_HEADS, D, dtype=torch.float64)
    for seq, slot in enumerate(slots[: len(starts) - 1]):
        if slot < 0 or slot == null_slot:
            continue
        window = conv_cache[slot].double()
        window = window.T if dim_first else window  # [width - 1, dim]
        S = ssm_state[slot].double()
        if not has_initial[seq]:
            window, S = torch.zeros_like(window), torch.zeros_like(S)
        for t in range(starts[seq], starts[seq + 1]):
            window = torch.cat([window, x[t: t + 1]])
            y = F.silu((window * weight.T).sum(0))
            window = window[1:]
            q, k, v = y[: K_HEADS * D], y[K_HEADS * D: 2 * K_HEADS * D], y[2 * K_HEADS * D:]
            q, k = (z.view(K_HEADS, D) for z in (q, k))
            q, k = (z / torch.sqrt((z * z).sum(-1, keepdim=True) + 1e-6) for z in (q, k))
            v = v.view(V_HEADS, D)
            g = -torch.exp(A_log) * F.softplus(a[t] + dt_bias)
            beta = torch.sigmoid(b[t])
            for hv in range(V_HEADS):
                kh, qh = k[hv // (V_HEADS // K_HEADS)], q[hv // (V_HEADS // K_HEADS)]
                S[hv] = torch.exp(g[hv]) * S[hv]
                S[hv] = S[hv] + torch.outer(beta[hv] * (v[hv] - S[hv] @ kh), kh)
                out[t, hv] = S[hv] @ qh * D ** -0.5
        conv_cache[slot] = (window.T if dim_first else window).to(conv_cache.dtype)
        ssm_state[slot] = S.to(ssm_state.dtype)
    return out, conv_cache, ssm_state


class FallbackBase(torch.nn.Module):
    """Stands for vLLM's layer class: records the calls our override hands back."""

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        self.fallbacks.append(mixed_qkv.shape[0])


class Layer(gdn_layer.GdnLayerOverride, FallbackBase):
    pass


def make_layer(slots: int, dim_first: bool, seed: int = 0) -> Layer:
    gen = torch.Generator().manual_seed(seed)
    layer = Layer()
    layer.fallbacks, layer.prefix, layer.activation = [], "model.layers.0.linear_attn", "silu"
    layer.head_k_dim = layer.head_v_dim = D
    layer.conv1d = SimpleNamespace(weight=torch.randn(CONV_DIM, 1, WIDTH, generator=gen) * 0.5, bias=None)
    layer.A_log = torch.empty(V_HEADS).uniform_(math.log(0.01), math.log(2.0), generator=gen)
    layer.dt_bias = torch.randn(V_HEADS, generator=gen) * 0.5
    shape = (slots, CONV_DIM, WIDTH - 1) if dim_first else (slots, WIDTH - 1, CONV_DIM)
    layer.kv_cache = (torch.randn(*shape, generator=gen), torch.randn(slots, V_HEADS, D, D, generator=gen) * 0.3)
    return layer


def make_batch(lengths, num_decodes, slots, has_initial, padded_tokens=0, seed=1):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths) + padded_tokens
    metadata = SimpleNamespace(
        num_prefills=len(lengths) - num_decodes, num_decodes=num_decodes, num_actual_tokens=tokens,
        spec_sequence_masks=None, has_initial_state=torch.tensor(has_initial),
        non_spec_query_start_loc=torch.tensor([0] + lengths).cumsum(0).to(torch.int32),
        non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32))
    rows = tokens + 5  # vLLM's buffers are longer than the batch (padding for CUDA graphs)
    x = torch.randn(rows, CONV_DIM, generator=gen)
    b, a = torch.randn(rows, V_HEADS, generator=gen), torch.randn(rows, V_HEADS, generator=gen)
    return metadata, x, b, a


CASES = {  # lengths, decodes first as vLLM orders them; slots; has_initial_state
    "prefill-varlen": ([5, 70, 1], 0, [3, 1, 6], [True, False, True]),
    "mixed": ([1, 1, 9, 66], 2, [2, 5, 4, 1], [True, True, False, True]),
    "decode": ([1, 1, 1], 3, [4, 2, 6], [True, True, True]),
}


# The state-slot argument of each op, and whether the op is a decode one (one slot per token).
SLOT_ARGS = {"causal_conv1d_prefill": (5, False), "chunk_gated_delta_rule": (6, False),
             "causal_conv1d_decode": (4, True), "recurrent_gated_delta_rule_decode": (8, True)}


def _checking_slots(op, slot_arg, decode):
    """What the CUDA ops demand of the slots (csrc/driver/gdn_driver.cpp, check_vector), which the CPU references
    would not notice: a contiguous vector, and for the decode ops one slot per token."""

    def checked(*args, **kwargs):
        x, slots = args[0], args[slot_arg]
        assert slots.is_contiguous(), "the CUDA ops take contiguous state slots"
        assert not decode or slots.shape[0] == x.shape[0], "one state slot per decode token"
        return op(*args, **kwargs)
    return checked


@pytest.mark.parametrize("slot_layout", ["vector", "block-table-column"])
@pytest.mark.parametrize("null_slot", [-1, 0], ids=["v0.19-pad-minus1", "v0.20-null-block-0"])
@pytest.mark.parametrize("dim_first", [False, True], ids=["conv-SD", "conv-DS"])
@pytest.mark.parametrize("case", list(CASES))
def test_layer_core_matches_the_oracle(monkeypatch, force_ours, case, dim_first, null_slot, slot_layout):
    """block-table-column: an engine with speculative decoding gives non-speculative batches column 0 of a block
    table of 1 + K columns as their state slots, a strided view (found by the MTP test on our GDN kernels)."""
    from vllm_volta_fp4.plugin import compat

    monkeypatch.setattr(compat, "gdn_null_slot", lambda: null_slot)
    monkeypatch.setattr(compat, "gdn_conv_state_dim_first", lambda: dim_first)
    lengths, decodes, slots, has_initial = CASES[case]
    padded = 2 if case == "decode" else 0  # CUDA-graph padding of a decode batch: two entries with the pad slot
    if padded:  # vLLM's builder: num_decodes counts the real ones, the index tensor has the batch size
        lengths, slots, has_initial = lengths + [1] * padded, slots + [null_slot] * padded, has_initial + [True] * 2
    layer = make_layer(slots=8, dim_first=dim_first)
    metadata, x, b, a = make_batch(lengths, decodes, slots, has_initial)
    metadata.num_prefills -= padded
    metadata.num_actual_tokens = sum(lengths)
    if case == "decode":  # the persistent index buffer is longer than the batch; the CUDA ops check the length
        metadata.non_spec_state_indices_tensor = torch.tensor(slots + [7], dtype=torch.int32)
    if slot_layout == "block-table-column":
        column = metadata.non_spec_state_indices_tensor
        metadata.non_spec_state_indices_tensor = torch.stack([column, column + 100, column + 200], dim=1)[:, 0]
    for name, (slot_arg, decode) in SLOT_ARGS.items():
        monkeypatch.setattr(gdn, name, _checking_slots(getattr(gdn, name), slot_arg, decode))
    conv_before, ssm_before = (t.clone() for t in layer.kv_cache)
    out = torch.full((x.shape[0], V_HEADS, D), 7.0)
    monkeypatch.setattr(gdn_layer, "_layer_metadata", lambda prefix: metadata)

    layer._forward_core(mixed_qkv=x, b=b, a=a, core_attn_out=out)

    assert layer.fallbacks == []
    starts = metadata.non_spec_query_start_loc.tolist()
    ref_out, ref_conv, ref_ssm = oracle_core(x, a, b, layer.A_log, layer.dt_bias, layer.conv1d.weight[:, 0],
                                             conv_before, ssm_before, starts, slots, has_initial, null_slot,
                                             dim_first)
    tokens = metadata.num_actual_tokens
    torch.testing.assert_close(out[:tokens].double(), ref_out[:tokens], rtol=2e-4, atol=2e-4)
    assert (out[tokens:] == 7.0).all()  # rows past the batch untouched
    torch.testing.assert_close(layer.kv_cache[0].double(), ref_conv.double(), rtol=0, atol=0)
    torch.testing.assert_close(layer.kv_cache[1].double(), ref_ssm.double(), rtol=2e-4, atol=2e-4)
    unowned = sorted(set(range(8)) - {s for s in slots if s >= 0 and s != null_slot})
    assert torch.equal(layer.kv_cache[1][unowned], ssm_before[unowned])


def test_layer_core_declines_what_it_does_not_cover(monkeypatch, force_ours):
    lengths, decodes, slots, has_initial = CASES["mixed"]
    layer = make_layer(slots=8, dim_first=False)
    metadata, x, b, a = make_batch(lengths, decodes, slots, has_initial)
    monkeypatch.setattr(gdn_layer, "_layer_metadata", lambda prefix: metadata)
    before = [t.clone() for t in layer.kv_cache]
    out = torch.zeros(x.shape[0], V_HEADS, D)

    def declined() -> bool:
        layer.fallbacks.clear()
        layer._forward_core(mixed_qkv=x, b=b, a=a, core_attn_out=out)
        untouched = all(torch.equal(t, u) for t, u in zip(layer.kv_cache, before, strict=True)) and not out.any()
        return layer.fallbacks == [x.shape[0]] and untouched

    metadata.spec_sequence_masks = torch.ones(len(lengths), dtype=torch.bool)
    assert declined()
    metadata.spec_sequence_masks = None
    metadata.checkpoint = object()  # 0.32 prefix caching
    assert declined()
    del metadata.checkpoint
    layer.head_v_dim = 128
    assert declined()
    layer.head_v_dim = D
    monkeypatch.setattr(gdn_layer, "_layer_metadata", lambda prefix: None)  # profile run
    assert declined()
    monkeypatch.setattr(gdn_layer, "_layer_metadata", lambda prefix: metadata)
    monkeypatch.undo()  # the real predicate: CPU float32 tensors are not ours
    monkeypatch.setattr(gdn_layer, "_layer_metadata", lambda prefix: metadata)
    assert declined()


# ─── ChunkGatedDeltaRule ───────────────────────────────────────────────────────────────────────────────────────


def make_op(recorder: list):
    """The registered ChunkGatedDeltaRule override without vLLM's __init__ (0.32's asks the model config), its
    in-tree dispatch replaced by a recorder."""
    from vllm.model_executor.custom_op import CustomOp

    from vllm_volta_fp4.plugin import compat

    gdn_layer.install()
    op = CustomOp.__new__(compat.gdn_hook_classes()[1])
    torch.nn.Module.__init__(op)
    op._forward_method = lambda **kwargs: recorder.append(kwargs) or "vllm"
    return op


@requires_vllm
@pytest.mark.parametrize("l2norm_in_kernel", [True, False])
def test_chunk_gated_delta_rule_override_matches_the_definition(registry, force_ours, l2norm_in_kernel):
    batch = RandomGdnBatch([3, 70, 1, 17], K_HEADS, V_HEADS, D, dtype=torch.float32,
                               has_initial=[True, False, True, True])
    # unit-norm q, k rescaled: the kernel's l2norm undoes 3x; without it, 0.7x must survive
    batch.q, batch.k = (t * (3.0 if l2norm_in_kernel else 0.7) for t in (batch.q, batch.k))
    initial = batch.state[batch.state_indices.long()]
    initial[~batch.has_initial_state] = 0  # what vLLM hands the op
    initial_before = initial.clone()
    recorder = []
    op = make_op(recorder)
    o, final = op(q=batch.q[None], k=batch.k[None], v=batch.v[None], g=batch.g[None], beta=batch.beta[None],
                  initial_state=initial, output_final_state=True, cu_seqlens=batch.cu_seqlens,
                  chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=l2norm_in_kernel)
    assert recorder == []
    ref_state = initial_before.double()
    ref = gdn.reference_chunk_gated_delta_rule(
        batch.q.double(), batch.k.double(), batch.v.double(), batch.g.double(), batch.beta.double(), ref_state,
        torch.arange(4, dtype=torch.int32), batch.cu_seqlens, use_qk_l2norm=l2norm_in_kernel)
    assert o.shape == (1, *batch.v.shape)
    torch.testing.assert_close(o[0].double(), ref, rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(final.double(), ref_state, rtol=2e-4, atol=2e-4)
    assert torch.equal(initial, initial_before)  # as FLA: the initial state is not written
    o2, final2 = op(q=batch.q[None], k=batch.k[None], v=batch.v[None], g=batch.g[None], beta=batch.beta[None],
                    initial_state=initial, output_final_state=False, cu_seqlens=batch.cu_seqlens,
                    use_qk_l2norm_in_kernel=l2norm_in_kernel)
    assert final2 is None and torch.equal(o2, o)


@requires_vllm
def test_chunk_gated_delta_rule_override_hands_back_what_it_does_not_cover(registry, monkeypatch):
    batch = RandomGdnBatch([3, 5], K_HEADS, V_HEADS, D, dtype=torch.float32)
    args = dict(q=batch.q[None], k=batch.k[None], v=batch.v[None], g=batch.g[None], beta=batch.beta[None],
                initial_state=batch.state[batch.state_indices.long()], output_final_state=True,
                cu_seqlens=batch.cu_seqlens, use_qk_l2norm_in_kernel=True)
    recorder = []
    op = make_op(recorder)
    assert op(**args) == "vllm"  # CPU tensors: vLLM's path
    monkeypatch.setattr(gdn_layer, "_our_kernels_run", lambda activations, states=(): True)
    assert op(**{**args, "cu_seqlens": None}) == "vllm"  # batched without cu_seqlens
    assert op(**args, core_attn_out=torch.empty(1)) == "vllm"  # 0.32's in-place output
    assert len(recorder) == 3 and recorder[0]["cu_seqlens"] is batch.cu_seqlens


# ─── RMSNormGated ──────────────────────────────────────────────────────────────────────────────────────────────


@requires_vllm
@pytest.mark.parametrize("activation", ["swish", "silu"])
def test_gated_rms_norm_override_matches_vllms_native(registry, force_ours, monkeypatch, activation):
    from vllm.config import VllmConfig, set_current_vllm_config

    from vllm_volta_fp4.plugin import compat

    gdn_layer.install()
    with set_current_vllm_config(VllmConfig()):
        norm = compat.gdn_hook_classes()[2](128, eps=1e-6, group_size=None, norm_before_gate=True,
                                            activation=activation)
    assert isinstance(norm, gdn_layer.RMSNormGatedOverride)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(128, generator=gen))
    x, zz = torch.randn(37, 128 + 64, generator=gen), torch.randn(37, 128, generator=gen) * 3
    x = x[:, :128]  # rows with a stride, as the layer's views
    calls = []
    monkeypatch.setattr(gdn, "gated_rms_norm", lambda *args: calls.append(args) or gdn.reference_gated_rms_norm(*args))
    got = norm(x, zz)
    assert len(calls) == 1
    torch.testing.assert_close(got, norm.forward_native(x, zz), rtol=1e-5, atol=1e-5)
    norm.norm_before_gate = False  # not the GDN configuration: vLLM's own
    torch.testing.assert_close(norm(x, zz), norm.forward_native(x, zz), rtol=0, atol=0)
    assert len(calls) == 1
