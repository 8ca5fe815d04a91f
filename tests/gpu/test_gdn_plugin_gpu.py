"""vllm_volta_fp4.plugin.gdn_layer on the device: each override against vLLM's own Triton path on the same fp16
inputs (the GDN layer core with copies of the same caches, ChunkGatedDeltaRule against FLA's
chunk_gated_delta_rule, RMSNormGated against its forward_cuda). Both sides are fp16 approximations of the same
float32/64 maths, so the tolerance is the sum of their errors against the float64 reference (tests/gpu/
test_gdn_gpu.py: ours ≈ 5e-4 relative; FLA's bf16/fp16 chunked path is of the same order).

Skipped without CUDA, the built extension or vLLM's GDN layer (Triton)."""

from __future__ import annotations

import dataclasses
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from devkit.engine import uninstall_gdn_overrides
from devkit.random_batches import RandomGdnBatch
from vllm_volta_fp4.ops import gdn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gdn.kernels_available(), reason="needs CUDA and vllm_volta_fp4._C with the GDN ops"),
]

REL_TOL = 5e-3
NORM_REL_TOL = 2e-3


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    assert not got.isnan().any() and not ref.isnan().any()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


@pytest.fixture
def hooks(triton_allocator):
    pytest.importorskip("vllm")
    from vllm_volta_fp4.plugin import compat, gdn_layer

    classes = compat.gdn_hook_classes()
    if classes is None:
        pytest.skip("this vLLM has no GDN layer we hook")
    uninstall_gdn_overrides()
    assert gdn_layer.install()
    from vllm.model_executor.custom_op import op_registry_oot

    yield SimpleNamespace(base=classes, ours=tuple(op_registry_oot[c.__name__] for c in classes))
    uninstall_gdn_overrides()


def _metadata(lengths: list[int], num_decodes: int, num_prefills: int, slots: list[int], has_initial: list[bool],
              tokens: int):
    """vLLM's GDNAttentionMetadata of a non-speculative batch (decodes first, then prefills, then CUDA-graph
    padding entries), built as its builder does."""
    from vllm.v1.attention.backends import gdn_attn, utils

    qsl = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    values = dict(num_prefills=num_prefills, num_prefill_tokens=sum(lengths[num_decodes:]) if num_prefills else 0,
                  num_decodes=num_decodes, num_decode_tokens=num_decodes, num_spec_decodes=0,
                  num_spec_decode_tokens=0, num_actual_tokens=tokens,
                  non_spec_query_start_loc=qsl.cuda(),
                  non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32, device="cuda"))
    if num_prefills:
        values["has_initial_state"] = torch.tensor(has_initial, device="cuda")
        nums_dict, batch_ptr, offsets = utils.compute_causal_conv1d_metadata(qsl, device=torch.device("cuda"))
        values.update(nums_dict=nums_dict, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)
        # 0.32: the prefill tail precomputed by the builder
        values.update(prefill_state_indices=values["non_spec_state_indices_tensor"][num_decodes:],
                      prefill_has_initial_state=values["has_initial_state"][num_decodes:],
                      prefill_query_start_loc=(qsl[num_decodes:] - qsl[num_decodes]).cuda())
    fields = {f.name for f in dataclasses.fields(gdn_attn.GDNAttentionMetadata)}
    return gdn_attn.GDNAttentionMetadata(**{k: v for k, v in values.items() if k in fields})


def _layer(cls, k_heads: int, v_heads: int, d: int, slots: int, ssm_dtype: torch.dtype, packed: bool, seed: int):
    """An instance of the registered layer class with just what ``_forward_core`` reads (no vLLM config)."""
    from vllm_volta_fp4.plugin import compat

    gen = torch.Generator().manual_seed(seed)
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    conv_dim = d * (2 * k_heads + v_heads)
    layer.prefix, layer.activation, layer.tp_size = "model.layers.0.linear_attn", "silu", 1
    layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim = k_heads, v_heads, d, d
    layer.key_dim, layer.value_dim, layer.conv_kernel_size = k_heads * d, v_heads * d, 4
    layer.enable_packed_recurrent_decode = packed
    layer.conv1d = SimpleNamespace(weight=(torch.randn(conv_dim, 1, 4, generator=gen) * 0.5).half().cuda(), bias=None)
    layer.A_log = torch.empty(v_heads).uniform_(math.log(0.01), math.log(2.0), generator=gen).cuda()
    layer.dt_bias = (torch.randn(v_heads, generator=gen) * 0.5).half().cuda()
    shape = (slots, conv_dim, 3) if compat.gdn_conv_state_dim_first() else (slots, 3, conv_dim)
    layer.kv_cache = (torch.randn(*shape, generator=gen).half().cuda(),
                      (torch.randn(slots, v_heads, d, d, generator=gen) * 0.3).to(ssm_dtype).cuda())
    return layer


CASES = {  # lengths (decodes first), decodes, has_initial_state
    "prefill-varlen": ([5, 300, 1, 64], 0, [True, False, True, True]),
    "mixed": ([1, 1, 9, 130], 2, [True, True, False, True]),
    "decode": ([1] * 6, 6, [True] * 6),
}


@pytest.mark.parametrize("packed", [False, True], ids=["decode-fused-sigmoid", "decode-packed"])
@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("heads", [(2, 4, 64), (4, 12, 128)], ids=lambda h: f"{h[0]}k{h[1]}v-d{h[2]}")
@pytest.mark.parametrize("case", list(CASES))
def test_layer_core_matches_vllms_triton_path(hooks, monkeypatch, case, heads, ssm_dtype, packed):
    import vllm.forward_context

    from vllm_volta_fp4.plugin import compat

    if packed and case != "decode":
        pytest.skip("the packed decode path is taken for decode-only batches")
    lengths, decodes, has_initial = CASES[case]
    null_slot = compat.gdn_null_slot()
    slots = [3 + 2 * i for i in range(len(lengths))]
    prefills = len(lengths) - decodes
    if case == "decode":  # two CUDA-graph padding entries (not counted in num_decodes)
        lengths, slots = lengths + [1, 1], slots + [null_slot] * 2
    tokens = sum(lengths)
    layer = _layer(hooks.ours[0], *heads, slots=max(slots) + 2, ssm_dtype=ssm_dtype, packed=packed, seed=len(lengths))
    layer_module = sys.modules[hooks.base[0].__module__]
    layer.chunk_gated_delta_rule = lambda **kw: layer_module.fla_chunk_gated_delta_rule(**kw)  # vLLM's own
    metadata = _metadata(lengths, decodes, prefills, slots, has_initial + [True] * (len(lengths) - len(has_initial)),
                         tokens)
    context = SimpleNamespace(attn_metadata={layer.prefix: metadata})
    monkeypatch.setattr(layer_module, "get_forward_context", lambda: context)
    monkeypatch.setattr(vllm.forward_context, "get_forward_context", lambda: context)

    gen = torch.Generator().manual_seed(7)
    k_heads, v_heads, d = heads
    rows = tokens + 3
    x = torch.randn(rows, d * (2 * k_heads + v_heads), generator=gen).half().cuda()
    b, a = (torch.randn(rows, v_heads, generator=gen).half().cuda() for _ in range(2))
    caches = [t.clone() for t in layer.kv_cache]
    assert layer._volta_declines(x, metadata) is None

    ref_out = torch.zeros(rows, v_heads, d, dtype=torch.float16, device="cuda")
    # vLLM's Triton path; its causal_conv1d_update writes the conv output over its input, so it gets a copy
    hooks.base[0]._forward_core(layer, mixed_qkv=x.clone(), b=b, a=a, core_attn_out=ref_out)
    ref_caches = layer.kv_cache
    layer.kv_cache = caches
    out = torch.zeros_like(ref_out)
    layer._forward_core(mixed_qkv=x, b=b, a=a, core_attn_out=out)
    torch.cuda.synchronize()

    real = [i for i, s in enumerate(slots) if s >= 0 and s != null_slot]
    real_tokens = torch.cat([torch.arange(sum(lengths[:i]), sum(lengths[: i + 1])) for i in real])
    print(f"{case} {heads} {ssm_dtype}: out rel {_rel(out[real_tokens], ref_out[real_tokens]):.2e}")
    assert _rel(out[real_tokens], ref_out[real_tokens]) < REL_TOL
    assert torch.equal(out[tokens:], ref_out[tokens:])
    owned = torch.tensor([slots[i] for i in real])
    assert torch.equal(layer.kv_cache[0][owned], ref_caches[0][owned])  # the conv state is a copy of inputs
    assert _rel(layer.kv_cache[1][owned], ref_caches[1][owned]) < REL_TOL
    # slots no sequence owns are untouched by both (0.20's null block 0 may be scribbled on by vLLM: not compared)
    others = torch.tensor([s for s in range(layer.kv_cache[1].shape[0]) if s not in owned.tolist() + [null_slot]])
    assert torch.equal(layer.kv_cache[1][others], ref_caches[1][others])


@pytest.mark.parametrize("l2norm", [True, False])
def test_chunk_gated_delta_rule_matches_fla(hooks, l2norm):
    from vllm.model_executor.custom_op import CustomOp

    batch = RandomGdnBatch([70, 1, 200, 33], 4, 12, 128, has_initial=[True, False, True, True],
                               normalised=not l2norm, device="cuda", seed=3)
    initial = batch.state[batch.state_indices.long()]
    initial[~batch.has_initial_state] = 0
    args = dict(q=batch.q[None], k=batch.k[None], v=batch.v[None], g=batch.g[None], beta=batch.beta[None],
                initial_state=initial, output_final_state=True, cu_seqlens=batch.cu_seqlens,
                use_qk_l2norm_in_kernel=l2norm)
    op = CustomOp.__new__(hooks.base[1])
    torch.nn.Module.__init__(op)
    assert isinstance(op, hooks.ours[1])
    o, final = op(**args)
    ref_o, ref_final = sys.modules[hooks.base[1].__module__].fla_chunk_gated_delta_rule(**args)
    torch.cuda.synchronize()
    print(f"chunk l2norm={l2norm}: out rel {_rel(o, ref_o):.2e}, state rel {_rel(final, ref_final):.2e}")
    assert _rel(o, ref_o) < REL_TOL and _rel(final, ref_final.to(final.dtype)) < REL_TOL


@pytest.mark.parametrize("d", gdn.HEAD_DIMS)
def test_gated_rms_norm_matches_vllms_forward_cuda(hooks, d):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        norm = hooks.base[2](d, eps=1e-6, group_size=None, norm_before_gate=True, device="cuda",
                             dtype=torch.float16)
    assert isinstance(norm, hooks.ours[2])
    gen = torch.Generator().manual_seed(d)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=gen))
    x = torch.randn(1000, d, generator=gen).half().cuda()
    z = (torch.randn(1000, d, generator=gen) * 3).half().cuda()
    got, ref = norm(x, z), norm.forward_cuda(x, z)
    torch.cuda.synchronize()
    print(f"gated rmsnorm d={d}: rel {_rel(got, ref):.2e}")
    assert _rel(got, ref) < NORM_REL_TOL


def test_gated_rms_norm_override_compiles_without_graph_breaks(hooks):
    """vLLM compiles the layer's forward, where the norm is called: the override must trace in one graph."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        norm = hooks.base[2](128, eps=1e-6, group_size=None, norm_before_gate=True, device="cuda",
                             dtype=torch.float16)
    x, z = torch.randn(64, 128, device="cuda").half(), torch.randn(64, 128, device="cuda").half()
    compiled = torch.compile(norm, fullgraph=True)
    torch.testing.assert_close(compiled(x, z), norm(x, z), rtol=0, atol=0)
