"""Run in a fresh interpreter by test_trace_safety.py: traces, with ``torch.compile(fullgraph=True)``, every piece of
the plugin that vLLM's compiled model forward reaches (or that runs inside vLLM's opaque attention / GDN ops), on
fake CUDA tensors, with the CUDA-kernel branch taken — on a machine that has neither CUDA nor the extension.

How the plugin is made to believe the extension is loaded: before any plugin module is imported, the ``volta_fp4``
op schemas are defined from the ``m.def("…")`` strings of csrc/ (so they cannot drift from the real extension), and
an empty module stands in for ``vllm_volta_fp4._C`` in ``sys.modules``. ``torch.cuda.is_available`` answers True,
as on the GPU. The plugin then registers its own fake implementations, as it does there.

Prints one line ``RESULTS {json}``: check name → "ok" or the error (its last lines)."""

from __future__ import annotations

import json
import re
import sys
import traceback
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def extension_schemas() -> list[str]:
    """Every op schema the extension defines, as its host code's STABLE_TORCH_LIBRARY blocks spell them (adjacent
    literals joined)."""
    schemas = []
    for path in sorted((ROOT / "csrc" / "driver").glob("*.cpp")):
        source = path.read_text()
        for literals in re.findall(r'm\.def\(\s*((?:"[^"]*"\s*)+)', source):
            schemas.append("".join(re.findall(r'"([^"]*)"', literals)))
    return schemas


def stand_in_for_the_extension() -> torch.library.Library:
    library = torch.library.Library("volta_fp4", "DEF")
    for schema in extension_schemas():
        library.define(schema)
    # The one op the plugin calls eagerly while loading (the GEMM cut-overs); the rest only ever see fakes here.
    library.impl("configure_gemm", lambda gemv_max_m, cublas_min_m, dequant_chunk_mib: None,
                 "CompositeExplicitAutograd")
    sys.modules["vllm_volta_fp4._C"] = types.ModuleType("vllm_volta_fp4._C")
    return library


def pretend_cuda_is_available() -> None:
    """torch.cuda.is_available() answers True, as on the GPU; Dynamo then saves and restores the CUDA RNG state
    around each trace, which needs stand-ins too."""
    torch.cuda.is_available = lambda: True
    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda new_state, device="cuda": None


def fake_cuda(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def compiled(fn, *expected_ops: str):
    """``fn`` under torch.compile(fullgraph=True); on its first call, checks that the traced graph calls each of
    ``expected_ops`` (``torch.ops.volta_fp4.<name>``): the kernel branch was taken, not the reference. Dynamo runs
    the plugin's fake implementations while it traces; the graph then runs as traced (AOT functionalisation would
    copy mutated inputs back, which a fake CUDA tensor cannot do without CUDA)."""

    def backend(graph_module, example_inputs):
        called = {str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"}
        missing = [op for op in expected_ops if not {f"volta_fp4.{op}", f"volta_fp4.{op}.default"} & called]
        assert not missing, f"the traced graph does not call {missing}; it calls {sorted(called)}"
        return graph_module.forward

    return torch.compile(fn, fullgraph=True, backend=backend)


def linear_apply(method_name: str):
    from torch import nn

    from vllm_volta_fp4.plugin.quantization import fp8, nvfp4

    method_cls = {"nvfp4": nvfp4.NvFp4LinearMethod, "fp8": fp8.Fp8LinearMethod}[method_name]
    method = method_cls.__new__(method_cls)  # apply() reads only the layer; the checkpoint scheme is not needed
    layer = nn.Module()
    for name, tensor in (("weight_tiles", fake_cuda(4096, dtype=torch.uint8)),
                         ("row_scale", fake_cuda(64, dtype=torch.float32)),
                         ("split_k_counters", fake_cuda(16, dtype=torch.int32))):
        layer.register_parameter("volta_" + name, nn.Parameter(tensor, requires_grad=False))
    layer.volta_tensor_names = ("weight_tiles", "row_scale", "split_k_counters")
    op = {"nvfp4": "nvfp4_gemm", "fp8": "fp8_gemm"}[method_name]
    y = compiled(lambda x: method.apply(layer, x, None), op)(fake_cuda(3, 5, 128))
    assert y.shape == (3, 5, 64) and y.is_cuda, (y.shape, y.device)


def gated_rms_norm():
    from torch import nn
    from vllm.config import VllmConfig, set_current_vllm_config

    from vllm_volta_fp4.plugin import compat, gdn_layer

    assert gdn_layer.install()
    with set_current_vllm_config(VllmConfig()):
        norm = compat.gdn_hook_classes()[2](128, eps=1e-6, group_size=None, norm_before_gate=True, activation="silu")
    assert isinstance(norm, gdn_layer.RMSNormGatedOverride)
    norm.weight = nn.Parameter(fake_cuda(128), requires_grad=False)
    out = compiled(lambda x, z: norm(x, z), "gdn_gated_rms_norm")(fake_cuda(7, 128), fake_cuda(7, 128))
    assert out.shape == (7, 128) and out.is_cuda


def attention_ops():
    from vllm_volta_fp4.ops import attention

    def step(query, key, value, kv_cache, block_table, query_start_loc, seq_lens, slot_mapping):
        attention.write_kv_cache(key, value, kv_cache, slot_mapping)
        return attention.paged_attention(query, kv_cache, block_table, query_start_loc, seq_lens, 256, 0.125)

    out = compiled(step, "write_kv_cache", "paged_attention")(fake_cuda(4, 8, 128), fake_cuda(4, 2, 128),
                                                              fake_cuda(4, 2, 128),
                         fake_cuda(10, 2, 16, 2, 128), fake_cuda(4, 16, dtype=torch.int32),
                         fake_cuda(5, dtype=torch.int32), fake_cuda(4, dtype=torch.int32),
                         fake_cuda(4, dtype=torch.int64))
    assert out.shape == (4, 8, 128) and out.is_cuda


def split_qkv(x):
    # narrow, not x[:, a:b]: indexing a fake CUDA tensor needs CUDA's device guard, which a CPU build lacks
    q, k, v = x.narrow(1, 0, 256), x.narrow(1, 256, 256), x.narrow(1, 512, 512)
    return q.unflatten(1, (2, 128)), k.unflatten(1, (2, 128)), v.unflatten(1, (4, 128))


def gdn_decode_ops():
    from vllm_volta_fp4.ops import gdn

    def step(x, weight, conv_state, slots, a, b, A_log, dt_bias, ssm_state):
        x = gdn.causal_conv1d_decode(x, weight, None, conv_state, slots)
        q, k, v = split_qkv(x)
        return gdn.recurrent_gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_state, slots)

    out = compiled(step, "gdn_causal_conv1d_decode", "gdn_recurrent_decode")(
                         fake_cuda(3, 1024), fake_cuda(1024, 4), fake_cuda(6, 1024, 3), fake_cuda(3, dtype=torch.int32),
                         fake_cuda(3, 4), fake_cuda(3, 4), fake_cuda(4, dtype=torch.float32),
                         fake_cuda(4, dtype=torch.float32), fake_cuda(6, 4, 128, 128, dtype=torch.float32))
    assert out.shape == (3, 4, 128) and out.is_cuda


def gdn_prefill_ops():
    from vllm_volta_fp4.ops import gdn

    def step(x, weight, conv_state, starts, slots, has_initial, a, b, A_log, dt_bias, ssm_state):
        x = gdn.causal_conv1d_prefill(x, weight, None, conv_state, starts, slots, has_initial)
        q, k, v = split_qkv(x)
        g, beta = gdn.gdn_gating(A_log, a, b, dt_bias)
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, ssm_state, slots, starts, has_initial, use_qk_l2norm=True)

    out = compiled(step, "gdn_causal_conv1d_prefill", "gdn_chunked_prefill")(
                         fake_cuda(9, 1024), fake_cuda(1024, 4), fake_cuda(6, 1024, 3), fake_cuda(3, dtype=torch.int32),
                         fake_cuda(2, dtype=torch.int32), fake_cuda(2, dtype=torch.bool), fake_cuda(9, 4),
                         fake_cuda(9, 4), fake_cuda(4, dtype=torch.float32), fake_cuda(4, dtype=torch.float32),
                         fake_cuda(6, 4, 128, 128, dtype=torch.float32))
    assert out.shape == (9, 4, 128) and out.is_cuda


CHECKS = {"nvfp4 linear apply": lambda: linear_apply("nvfp4"), "fp8 linear apply": lambda: linear_apply("fp8"),
          "gated RMSNorm override": gated_rms_norm, "attention ops": attention_ops,
          "GDN decode ops": gdn_decode_ops, "GDN prefill ops": gdn_prefill_ops}


def main() -> None:
    import vllm  # noqa: F401  (before CUDA is faked: vLLM resolves its platform at import)
    from torch._subclasses.fake_tensor import FakeTensorMode

    library = stand_in_for_the_extension()  # noqa: F841  (kept alive: dropping it deregisters the schemas)
    pretend_cuda_is_available()
    results = {}
    for name, check in CHECKS.items():
        torch._dynamo.reset()
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                check()
            results[name] = "ok"
        except Exception as error:  # noqa: BLE001  (reported to the test)
            results[name] = "".join(traceback.format_exception(error))[-3000:]
    print("RESULTS", json.dumps(results))


if __name__ == "__main__":
    main()
