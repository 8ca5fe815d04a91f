"""The vLLM glue without an engine: registration, checkpoint claiming, and vLLM's own linear layers and weight
loaders driving our linear methods at tensor-parallel ranks 1, 2 and 4 (ranks simulated in one process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import requires_vllm
from vllm_volta_fp4.format.checkpoint import Checkpoint
from vllm_volta_fp4.format.nvfp4 import dequantize_fp8, dequantize_nvfp4


def test_import_and_register_work_without_vllm():
    code = ("import sys, logging; sys.modules['vllm'] = None; logging.basicConfig(level=logging.INFO); "
            "import vllm_volta_fp4; vllm_volta_fp4.register(); vllm_volta_fp4.register(); print('imported')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout
    assert result.stderr.count("vLLM is not installed") == 2


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    points = {point.name: point.value for point in entry_points(group="vllm.general_plugins")}
    assert points.get("volta_nvfp4") == "vllm_volta_fp4:register"


@requires_vllm
def test_register_is_idempotent_and_exposes_the_method():
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    import vllm_volta_fp4

    vllm_volta_fp4.register()
    vllm_volta_fp4.register()
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    assert QUANTIZATION_METHODS.count("volta_nvfp4") == 1
    assert get_quantization_config("volta_nvfp4") is VoltaNvfp4Config
    assert VoltaNvfp4Config.get_min_capability() == 70


def _model_config(path, **kwargs):
    from vllm.config import ModelConfig

    return ModelConfig(model=str(path), dtype="float32", max_model_len=256, **kwargs)


@requires_vllm
@pytest.mark.parametrize("fmt", ["modelopt-nvfp4", "modelopt-w4a16", "modelopt-mixed", "ct-w4a16", "ct-w4a4"])
def test_vllm_accepts_every_format_when_asked_for_volta_nvfp4(tiny_checkpoints, fmt):
    import vllm_volta_fp4

    vllm_volta_fp4.register()
    assert _model_config(tiny_checkpoints[fmt], quantization="volta_nvfp4").quantization == "volta_nvfp4"


@requires_vllm
def test_on_cpu_an_unasked_nvfp4_checkpoint_says_what_to_pass(tiny_checkpoints):
    import vllm_volta_fp4

    vllm_volta_fp4.register()
    with pytest.raises(Exception, match="--quantization volta_nvfp4"):
        _model_config(tiny_checkpoints["modelopt-nvfp4"])


@requires_vllm
@pytest.mark.parametrize(("capability", "claimed"), [(70, True), (75, False), (90, False)])
def test_unasked_nvfp4_is_claimed_only_below_turing(monkeypatch, tiny_checkpoints, capability, claimed):
    from vllm_volta_fp4.format.checkpoint import read_quant_config
    from vllm_volta_fp4.plugin.quantization import config

    monkeypatch.setattr(config, "device_capability", lambda: capability)
    monkeypatch.setattr(config, "is_cpu_platform", lambda: False)
    for fmt in ("modelopt-nvfp4", "ct-w4a4"):
        quant_config, _ = read_quant_config(tiny_checkpoints[fmt])
        claimed_as = config.VoltaNvfp4Config.override_quantization_method(quant_config, None)
        assert claimed_as == ("volta_nvfp4" if claimed else None)
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    assert config.VoltaNvfp4Config.override_quantization_method(awq, None) is None
    with pytest.raises(config.CheckpointRefused, match=r"unknown quantization config \(quant_method 'awq'\)"):
        config.VoltaNvfp4Config.override_quantization_method(awq, "volta_nvfp4")  # asked for by name: say why not
    nvfp4, _ = read_quant_config(tiny_checkpoints["modelopt-nvfp4"])
    assert config.VoltaNvfp4Config.override_quantization_method(nvfp4, "modelopt_fp4") is None


def _quant_config(checkpoint_dir):
    import vllm_volta_fp4
    from vllm_volta_fp4.format.checkpoint import read_quant_config
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    vllm_volta_fp4.register()
    config = VoltaNvfp4Config.from_config(read_quant_config(checkpoint_dir)[0])
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                     "gate_up_proj": ["gate_proj", "up_proj"]}
    return config


def _dense(checkpoint: Checkpoint, module: str) -> torch.Tensor:
    scheme = checkpoint.format.scheme_for(module)
    if scheme.kind == "nvfp4":
        weight = checkpoint.load_nvfp4(module)
        return dequantize_nvfp4(weight.packed, weight.block_scale, weight.global_scale)
    return dequantize_fp8(*checkpoint.load_fp8(module))


def _load_checkpoint_tensors(layer, checkpoint: Checkpoint, module: str, shard_id):
    """Feed every tensor of checkpoint module ``module`` through the layer's own weight loader, as vLLM does."""
    for name in checkpoint.tensors:
        parent, _, leaf = name.rpartition(".")
        if parent != module:
            continue
        param = getattr(layer, leaf)
        loaded = checkpoint.load(name)
        if shard_id is None:
            param.weight_loader(param, loaded)
        else:
            param.weight_loader(param, loaded, shard_id)


def _build(kind: str, config, arch_sizes):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    hidden, intermediate, heads, kv_heads, head_dim = arch_sizes
    if kind == "qkv":
        return QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias=False, quant_config=config,
                                 prefix="model.layers.0.self_attn.qkv_proj")
    if kind == "gate_up":
        return MergedColumnParallelLinear(hidden, [intermediate] * 2, bias=False, quant_config=config,
                                          prefix="model.layers.0.mlp.gate_up_proj")
    return RowParallelLinear(intermediate, hidden, bias=False, quant_config=config,
                             prefix="model.layers.0.mlp.down_proj")


LLAMA_SIZES = (320, 864, 8, 2, 64)
# The checkpoint modules behind each fused layer of _build, with the shard id vLLM's loader takes for each.
SHARDS = {"qkv": [("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v")],
          "gate_up": [("mlp.gate_proj", 0), ("mlp.up_proj", 1)], "down": [("mlp.down_proj", None)]}


def _loaded_layer(checkpoint: Checkpoint, config, kind: str, shards=None):
    """A ``kind`` layer of layer 0 (at the simulated TP rank) with the checkpoint's tensors of ``shards`` (default:
    all of the kind's) fed through its loaders; weights not yet processed."""
    layer = _build(kind, config, LLAMA_SIZES)
    for name, shard_id in SHARDS[kind] if shards is None else shards:
        _load_checkpoint_tensors(layer, checkpoint, "model.layers.0." + name, shard_id)
    return layer


@requires_vllm
@pytest.mark.parametrize("fmt", ["modelopt-nvfp4", "ct-w4a16", "modelopt-mixed"])
@pytest.mark.parametrize(("kind", "tp"), [(kind, tp) for kind in ("qkv", "gate_up", "down") for tp in (1, 2, 4)
                                          if not (kind == "down" and tp == 4)])  # 864/4 is not whole blocks: below
def test_vllm_loaders_shard_and_our_apply_matches_the_dense_shard(simulated_tp, tiny_checkpoints, fmt, kind, tp):
    checkpoint = Checkpoint(tiny_checkpoints[fmt])
    config = _quant_config(tiny_checkpoints[fmt])
    shards = SHARDS[kind]
    full = {name: _dense(checkpoint, "model.layers.0." + name) for name, _ in shards}
    hidden, intermediate, heads, kv_heads, head_dim = LLAMA_SIZES
    x = torch.randn(3, full[shards[0][0]].shape[1] // (tp if kind == "down" else 1),
                    generator=torch.Generator().manual_seed(tp))
    for rank in range(tp):
        simulated_tp(rank, tp)
        layer = _loaded_layer(checkpoint, config, kind)
        layer.quant_method.process_weights_after_loading(layer)
        got = layer.quant_method.apply(layer, x)
        # the dense rows (and, row-parallel, columns) this rank owns, per vLLM's partitioning
        pieces = []
        for name, shard_id in shards:
            weight = full[name]
            if kind == "down":
                pieces.append(weight[:, rank * x.shape[1]:(rank + 1) * x.shape[1]])
            elif shard_id in ("k", "v") and kv_heads < tp:
                replica_group = rank // (tp // kv_heads)
                pieces.append(weight[replica_group * head_dim:(replica_group + 1) * head_dim])
            else:
                rows = weight.shape[0] // tp
                pieces.append(weight[rank * rows:(rank + 1) * rows])
        expected = x.double() @ torch.cat(pieces).double().T
        assert got.shape == expected.shape
        assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-5), (fmt, kind, tp, rank)


@requires_vllm
def test_row_parallel_split_off_a_16_element_boundary_is_a_clear_error(simulated_tp, tiny_checkpoints):
    from vllm.model_executor.layers.linear import RowParallelLinear

    config = _quant_config(tiny_checkpoints["modelopt-w4a16"])
    simulated_tp(0, 2)  # 864 / 2 = 432 = 27 blocks: fine; 864 / 4 = 216: not a whole number of blocks
    RowParallelLinear(864, 320, bias=False, quant_config=config, prefix="model.layers.0.mlp.down_proj")
    simulated_tp(0, 4)
    with pytest.raises(ValueError, match="216 input features per tensor-parallel rank.*multiple of 16"):
        RowParallelLinear(864, 320, bias=False, quant_config=config, prefix="model.layers.0.mlp.down_proj")


@requires_vllm
def test_a_shard_missing_from_the_checkpoint_is_caught_after_loading(simulated_tp, tiny_checkpoints):
    simulated_tp(0, 1)
    root = tiny_checkpoints["ct-w4a16"]
    layer = _loaded_layer(Checkpoint(root), _quant_config(root), "qkv", SHARDS["qkv"][:2])  # v never arrives
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.qkv_proj.weight_packed' "
                       r"\(fused shard \[2\] of 3\) was never loaded"):
        layer.quant_method.process_weights_after_loading(layer)


@requires_vllm
def test_a_nan_global_scale_is_reported_as_nan_not_as_never_loaded(simulated_tp, tiny_checkpoints):
    """The loaded-flag, not the scale's value, says whether a tensor arrived: a loaded NaN is called NaN."""
    simulated_tp(0, 1)
    root = tiny_checkpoints["modelopt-w4a16"]
    layer = _loaded_layer(Checkpoint(root), _quant_config(root), "gate_up")
    layer.weight_scale_2.data[1] = float("nan")
    with pytest.raises(ValueError, match=r"global scale 'weight_scale_2' of layer 'model.layers.0.mlp.gate_up_proj' is "
                       r"\[.*nan\]; scales must be finite"):
        layer.quant_method.process_weights_after_loading(layer)


@requires_vllm
def test_layers_stay_packed_after_loading(simulated_tp, tiny_checkpoints):
    simulated_tp(0, 1)
    root = tiny_checkpoints["modelopt-nvfp4"]
    layer = _loaded_layer(Checkpoint(root), _quant_config(root), "gate_up")
    layer.quant_method.process_weights_after_loading(layer)
    stored = sum(p.numel() * p.element_size() for p in layer.parameters())
    rows, cols = 2 * 864, 320
    assert stored == rows * cols // 2 + rows * cols // 16 + rows * 4  # 4.5 bits/weight + one fp32 scale per row
    assert not any(p.dtype in (torch.float16, torch.float32) and p.numel() == rows * cols for p in layer.parameters())


@requires_vllm
def test_get_quant_method_routes_layers(simulated_tp, tiny_checkpoints):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from vllm_volta_fp4.plugin.quantization.fp8 import Fp8LinearMethod
    from vllm_volta_fp4.plugin.quantization.nvfp4 import NvFp4LinearMethod

    simulated_tp(0, 1)
    mixed = _quant_config(tiny_checkpoints["modelopt-mixed"])
    assert isinstance(_build("qkv", mixed, LLAMA_SIZES).quant_method, Fp8LinearMethod)
    assert isinstance(_build("gate_up", mixed, LLAMA_SIZES).quant_method, NvFp4LinearMethod)
    from vllm.model_executor.layers.linear import ReplicatedLinear

    head = ReplicatedLinear(320, 384, bias=False, quant_config=mixed, prefix="lm_head")
    assert isinstance(head.quant_method, UnquantizedLinearMethod)
    assert json.loads((tiny_checkpoints["modelopt-mixed"] / "config.json").read_text())["quantization_config"]
