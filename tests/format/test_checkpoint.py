"""Checkpoint recognition, the canonical per-layer view, and a clear error for every malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_volta_fp4.format.checkpoint import (
    COMPRESSED_TENSORS,
    FP8,
    MODELOPT,
    NVFP4,
    UNQUANTIZED,
    Checkpoint,
    CheckpointError,
    parse_quant_config,
)
from vllm_volta_fp4.format.nvfp4 import dequantize_nvfp4
from vllm_volta_fp4.testing.tiny_model import FORMATS

Q_PROJ = "model.layers.0.self_attn.q_proj"
GATE = "model.layers.1.mlp.gate_proj"


@pytest.mark.parametrize(
    ("fmt", "producer", "algorithm", "config_file", "quantized_activations"),
    [("modelopt-nvfp4", MODELOPT, "NVFP4", "hf_quant_config.json", True),
     ("modelopt-w4a16", MODELOPT, "W4A16_NVFP4", "config.json", False),
     ("modelopt-mixed", MODELOPT, "MIXED_PRECISION", "config.json", None),
     ("ct-w4a16", COMPRESSED_TENSORS, "nvfp4-pack-quantized", "config.json", False),
     ("ct-w4a4", COMPRESSED_TENSORS, "nvfp4-pack-quantized", "config.json", True)],
)
def test_every_format_is_recognised(tiny_checkpoints, fmt, producer, algorithm, config_file, quantized_activations):
    checkpoint = Checkpoint(tiny_checkpoints[fmt])
    assert (checkpoint.format.producer, checkpoint.format.algorithm) == (producer, algorithm)
    assert checkpoint.config_file.name == config_file
    modules = checkpoint.validate()
    assert modules["lm_head"].kind == UNQUANTIZED and modules["model.embed_tokens"].kind == UNQUANTIZED
    assert modules[GATE].kind == NVFP4
    expected_attention = FP8 if fmt == "modelopt-mixed" else NVFP4
    assert modules[Q_PROJ].kind == expected_attention
    assert sum(scheme.kind != UNQUANTIZED for scheme in modules.values()) == 14  # 2 layers × 7 projections
    if quantized_activations is not None:
        assert modules[GATE].quantized_activations is quantized_activations


def test_the_canonical_view_hides_the_producer(tiny_checkpoints):
    """The same weights written by ModelOpt and by compressed-tensors (inverse global scale) read back identically."""
    views = {fmt: Checkpoint(tiny_checkpoints[fmt]).load_nvfp4(GATE)
             for fmt in ("modelopt-nvfp4", "modelopt-w4a16", "ct-w4a16", "ct-w4a4")}
    reference = views.pop("modelopt-nvfp4")
    for fmt, view in views.items():
        assert torch.equal(view.packed, reference.packed), fmt
        assert torch.equal(view.block_scale.view(torch.uint8), reference.block_scale.view(torch.uint8)), fmt
        # 1/(1/g) may differ from g by one ulp
        assert torch.allclose(view.global_scale, reference.global_scale, rtol=2e-7, atol=0), fmt
        assert view.global_scale.shape == ()


def test_fused_shards_keep_their_own_global_scales(tiny_checkpoints):
    checkpoint = Checkpoint(tiny_checkpoints["modelopt-nvfp4"])
    scales = {name: float(checkpoint.load_nvfp4(f"model.layers.0.self_attn.{name}").global_scale)
              for name in ("q_proj", "k_proj", "v_proj")}
    assert len(set(scales.values())) == 3


def test_fp8_layers_of_mixed_checkpoints_load(tiny_checkpoints):
    weight, scale = Checkpoint(tiny_checkpoints["modelopt-mixed"]).load_fp8(Q_PROJ)
    assert weight.dtype == torch.float8_e4m3fn and scale.shape == () and float(scale) > 0


def test_dequantized_weights_approximate_the_original(tiny_checkpoints):
    from vllm_volta_fp4.testing.tiny_model import _ARCHS, random_weights

    original = random_weights(_ARCHS["llama"], vocab=Checkpoint(tiny_checkpoints["ct-w4a16"]).tensors[
        "model.embed_tokens.weight"].shape[0])[f"{GATE}.weight"]
    view = Checkpoint(tiny_checkpoints["ct-w4a16"]).load_nvfp4(GATE)
    restored = dequantize_nvfp4(view.packed, view.block_scale, view.global_scale)
    assert float((restored - original).norm() / original.norm()) < 0.13


def test_tensors_are_read_lazily(tiny_checkpoints, monkeypatch):
    """Opening and validating reads headers and scales, never a packed weight matrix."""
    checkpoint = Checkpoint(tiny_checkpoints["modelopt-nvfp4"])
    loaded = []
    original = Checkpoint.load
    monkeypatch.setattr(Checkpoint, "load", lambda self, name: loaded.append(name) or original(self, name))
    checkpoint.validate()
    assert loaded and not any(name.endswith(".weight") for name in loaded)


@pytest.mark.parametrize(
    ("config", "message"),
    [({"quant_method": "awq", "bits": 4}, "unknown quantization config"),
     ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}, "not NVFP4"),
     ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "INT4_AWQ"}}, "not supported"),
     ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 32}}, "group_size"),
     ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, "quantized_layers"),
     ({"quant_method": "compressed-tensors", "format": "pack-quantized",
       "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}, "not NVFP4"),
     ({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
       "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 32}}}}, "not NVFP4"),
     ({"quant_method": "compressed-tensors", "format": "float-quantized",
       "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}, "no compressed")],
)
def test_unsupported_configs_are_refused_with_the_reason(config, message):
    with pytest.raises(CheckpointError, match=message) as error:
        parse_quant_config(config, "some/config.json")
    assert "some/config.json" in str(error.value)


def _rewrite(checkpoint_dir: Path, tensor: str, change) -> Path:
    """Apply ``change(tensors)`` to the shard holding ``tensor`` and keep the index consistent with it, as a
    producer that wrote the damaged tensors would; returns that shard's path."""
    shard = Checkpoint(checkpoint_dir).tensors[tensor].file
    tensors = load_file(shard)
    change(tensors)
    save_file(tensors, shard)
    index_file = checkpoint_dir / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    weight_map = {name: file for name, file in index["weight_map"].items() if file != shard.name}
    weight_map.update({name: shard.name for name in tensors})
    index_file.write_text(json.dumps({**index, "weight_map": weight_map}))
    return shard


def _set(name, value):
    return lambda tensors: tensors.__setitem__(name, value)


def _expect_error(checkpoint_dir: Path, file_name: str, tensor: str, message: str):
    with pytest.raises(CheckpointError, match=message) as error:
        Checkpoint(checkpoint_dir).validate()
    text = str(error.value)
    assert file_name in text and tensor in text and error.value.fix, text
    return error.value


MODELOPT_CASES = {
    "missing global scale": (f"{GATE}.weight_scale_2", lambda t: t.pop(f"{GATE}.weight_scale_2"), "missing tensor"),
    "missing block scale": (f"{GATE}.weight_scale", lambda t: t.pop(f"{GATE}.weight_scale"), "missing tensor"),
    "block scale wrong dtype": (f"{GATE}.weight_scale",
                                lambda t: t.__setitem__(f"{GATE}.weight_scale", t[f"{GATE}.weight_scale"].half()),
                                "dtype F16"),
    "block scale wrong shape": (f"{GATE}.weight_scale",
                                lambda t: t.__setitem__(f"{GATE}.weight_scale",
                                                        t[f"{GATE}.weight_scale"][:, :-1].contiguous()),
                                "shape"),
    "packed weight wrong dtype": (f"{GATE}.weight",
                                  lambda t: t.__setitem__(f"{GATE}.weight", t[f"{GATE}.weight"].to(torch.int32)),
                                  "dtype I32"),
    "nan global scale": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.tensor(float("nan"))), "nan"),
    "inf global scale": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.tensor(float("inf"))), "inf"),
    "zero global scale": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.tensor(0.0)),
                          "finite and positive"),
    "negative global scale": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.tensor(-1.0)),
                              "finite and positive"),
    "global scale not scalar": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.ones(3)),
                                "single value"),
    "global scale wrong dtype": (f"{GATE}.weight_scale_2", _set(f"{GATE}.weight_scale_2", torch.tensor(1.0).half()),
                                 "dtype F16"),
    "extra tensor": (f"{GATE}.weight_zero_point", _set(f"{GATE}.weight_zero_point", torch.zeros(1)),
                     "unexpected tensor"),
}


@pytest.mark.parametrize("case", sorted(MODELOPT_CASES))
def test_malformed_modelopt_checkpoints_name_file_and_tensor(fresh_checkpoint, case):
    tensor, change, message = MODELOPT_CASES[case]
    directory = fresh_checkpoint("modelopt-nvfp4")
    shard = _rewrite(directory, f"{GATE}.weight", change)
    _expect_error(directory, shard.name, tensor, message)


def test_nan_and_negative_block_scales_are_found(fresh_checkpoint):
    for value, message in ((0x7F, "NaN"), (0xFF, "NaN"), (0x90, "negative")):
        directory = fresh_checkpoint("ct-w4a16")
        name = f"{GATE}.weight_scale"

        def poison(tensors, value=value, name=name):
            scale = tensors[name].view(torch.uint8).clone()
            scale[3, 1] = value
            tensors[name] = scale.view(torch.float8_e4m3fn)

        shard = _rewrite(directory, name, poison)
        error = _expect_error(directory, shard.name, name, message)
        assert "[3, 1]" in str(error)


def test_compressed_tensors_zero_encode_scale_is_refused(fresh_checkpoint):
    directory = fresh_checkpoint("ct-w4a4")
    name = f"{GATE}.weight_global_scale"
    shard = _rewrite(directory, name, _set(name, torch.zeros(1)))
    _expect_error(directory, shard.name, name, "finite and positive")


def test_k_not_a_multiple_of_16_is_refused(fresh_checkpoint):
    """For an architecture outside the table (a known one would refuse the shape against config.json first)."""
    directory = fresh_checkpoint("modelopt-w4a16")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["SomeOtherForCausalLM"]}))

    def shrink(tensors):  # K = 24: 12 packed bytes per row, 1.5 blocks
        tensors[f"{GATE}.weight"] = tensors[f"{GATE}.weight"][:, :12].contiguous()
        tensors[f"{GATE}.weight_scale"] = tensors[f"{GATE}.weight_scale"][:, :1].contiguous()

    shard = _rewrite(directory, f"{GATE}.weight", shrink)
    _expect_error(directory, shard.name, f"{GATE}.weight", "K=24 is not a multiple of 16")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: data[: len(data) - 100], "truncated"),
    (lambda data: b"\xff" * 64, "not a readable safetensors file"),
])
def test_damaged_shards_are_refused_before_loading(fresh_checkpoint, damage, message):
    directory = fresh_checkpoint()
    shard = Checkpoint(directory).tensors[f"{GATE}.weight"].file
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as error:
        Checkpoint(directory)
    assert shard.name in str(error.value)


def test_index_pointing_at_a_missing_shard_is_refused(fresh_checkpoint):
    directory = fresh_checkpoint()
    shard = Checkpoint(directory).tensors[f"{GATE}.weight"].file
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"lists shard '{shard.name}', which is missing") as error:
        Checkpoint(directory)
    assert "model.safetensors.index.json" in str(error.value)


def test_index_and_shard_disagreeing_is_refused(fresh_checkpoint):
    directory = fresh_checkpoint()
    index_file = directory / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = index["weight_map"][f"{GATE}.weight"]
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="listed in the index but not in this shard") as error:
        Checkpoint(directory)
    assert "model.layers.9.mlp.up_proj.weight" in str(error.value)


def test_mixed_config_naming_a_layer_the_checkpoint_lacks_is_refused(fresh_checkpoint):
    directory = fresh_checkpoint("modelopt-mixed")
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["quantized_layers"]["model.layers.7.mlp.up_proj"] = {"quant_algo": "NVFP4"}
    (directory / "config.json").write_text(json.dumps(config))
    _expect_error(directory, "config.json", "model.layers.7.mlp.up_proj.weight", "no weight for it")


def test_quantized_tensor_in_an_excluded_layer_is_refused(fresh_checkpoint):
    directory = fresh_checkpoint("modelopt-nvfp4")
    config_file = directory / "hf_quant_config.json"
    config = json.loads(config_file.read_text())
    config["quantization"]["exclude_modules"].append("model.layers.1.mlp.*")
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unexpected tensor|leaves this module unquantized") as error:
        Checkpoint(directory).validate()
    assert "model.layers.1.mlp" in str(error.value)


def test_missing_config_and_unquantized_models_are_explained(tmp_path, fresh_checkpoint):
    with pytest.raises(CheckpointError, match="no config.json"):
        Checkpoint(tmp_path)
    directory = fresh_checkpoint("ct-w4a16")
    config = json.loads((directory / "config.json").read_text())
    del config["quantization_config"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not quantized"):
        Checkpoint(directory)


def test_exclusions_follow_modelopt_wildcards_and_compressed_tensors_regexes():
    modelopt = parse_quant_config({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "*.mlp.gate"]}})
    assert modelopt.scheme_for("lm_head").kind == UNQUANTIZED
    assert modelopt.scheme_for("model.layers.0.self_attn").kind == UNQUANTIZED
    assert modelopt.scheme_for("model.layers.0.self_attn.q_proj").kind == UNQUANTIZED
    assert modelopt.scheme_for("model.layers.3.mlp.gate").kind == UNQUANTIZED
    assert modelopt.scheme_for("model.layers.3.mlp.gate_proj").kind == NVFP4
    ct = parse_quant_config({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                             "ignore": ["lm_head", "re:.*linear_attn\\.in_proj_ba$"],
                             "config_groups": {"g": {"targets": ["Linear"], "weights": {
                                 "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}})
    assert ct.scheme_for("model.layers.0.linear_attn.in_proj_ba").kind == UNQUANTIZED
    assert ct.scheme_for("model.layers.0.linear_attn.in_proj_qkvz").kind == NVFP4


def test_fused_layers_need_agreeing_shards():
    mixed = parse_quant_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "m.q_proj": {"quant_algo": "FP8"}, "m.k_proj": {"quant_algo": "FP8"}, "m.v_proj": {"quant_algo": "NVFP4"}}})
    with pytest.raises(CheckpointError, match="stored differently"):
        mixed.scheme_for_fused("m.qkv_proj", ["q_proj", "k_proj", "v_proj"])
    assert mixed.scheme_for_fused("m.qk_proj", ["q_proj", "k_proj"]).kind == FP8


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_tiny_format_validates_for_qwen3_too(tmp_path, fmt):
    from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint

    modules = Checkpoint(make_tiny_checkpoint(tmp_path / fmt, "qwen3", fmt)).validate()
    assert sum(scheme.kind != UNQUANTIZED for scheme in modules.values()) == 14


@pytest.mark.parametrize("fmt", FORMATS)
def test_qwen3_5_hybrid_checkpoints_keep_their_real_exclusions(tmp_path, fmt):
    """Gated-DeltaNet hybrid (3 GDN + 1 gated full-attention layer, a vision tower): the decoder projections are
    quantized, the GDN b/a projections, the vision tower, lm_head and embeddings stay 16-bit, and conv1d, A_log,
    dt_bias and the norms are not linear layers at all — the checkpoint validates without complaint."""
    from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint

    modules = Checkpoint(make_tiny_checkpoint(tmp_path / fmt, "qwen3_5", fmt)).validate()
    gdn, full = "model.language_model.layers.0.linear_attn", "model.language_model.layers.3.self_attn"
    attention_kind = FP8 if fmt == "modelopt-mixed" else NVFP4
    for name in ("in_proj_qkv", "in_proj_z", "out_proj"):
        assert modules[f"{gdn}.{name}"].kind == attention_kind
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert modules[f"{full}.{name}"].kind == attention_kind
    assert modules["model.language_model.layers.2.mlp.down_proj"].kind == NVFP4
    for name in (f"{gdn}.in_proj_a", f"{gdn}.in_proj_b", "model.visual.blocks.0.attn.qkv",
                 "model.visual.merger.linear_fc1", "lm_head", "model.language_model.embed_tokens"):
        assert modules[name].kind == UNQUANTIZED, name
    assert not any(part in name for name in modules for part in ("conv1d", "A_log", "dt_bias", "norm"))
    assert sum(scheme.kind != UNQUANTIZED for scheme in modules.values()) == 25  # 3 × 6 + 7


def test_an_architecture_outside_the_table_is_validated_as_far_as_possible_and_says_so(fresh_checkpoint):
    directory = fresh_checkpoint("ct-w4a16")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["SomeOtherForCausalLM"]}))
    checkpoint = Checkpoint(directory)
    assert checkpoint.validate()[GATE].kind == NVFP4
    assert len(checkpoint.notes) == 1 and "SomeOtherForCausalLM is not one volta-fp4 knows" in checkpoint.notes[0]
