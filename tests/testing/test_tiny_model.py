"""The Qwen3.5 hybrid shapes of vllm_volta_fp4.testing.tiny_model: the benchmark's Qwen3.8-27B-width layers (built on
the meta device: names and shapes without values) against the real model's config, and the meta build against the
materialised tiny model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from vllm_volta_fp4.testing.tiny_model import _ARCHS, qwen3_5_config, qwen3_5_weights, qwen3_8_27b  # noqa: E402

REAL_CONFIG = json.loads((Path(__file__).parents[1] / "data" / "qwen3.8-27b-config.json").read_text())["text_config"]


def test_qwen3_8_27b_layers_have_the_real_widths_and_pattern():
    text = qwen3_5_config(qwen3_8_27b(8), vocab=384)["text_config"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim", "full_attention_interval", "rms_norm_eps", "hidden_act"):
        assert text[key] == REAL_CONFIG[key], key
    assert text["layer_types"] == REAL_CONFIG["layer_types"][:8]
    assert text["rope_parameters"]["partial_rotary_factor"] == REAL_CONFIG["partial_rotary_factor"]
    assert sum(text["rope_parameters"]["mrope_section"]) == text["head_dim"] // 8  # rotary pairs of 0.25 · 256


def test_qwen3_8_27b_layers_build_on_meta_with_hugging_face_names_and_shapes():
    weights = qwen3_5_weights(qwen3_5_config(qwen3_8_27b(8), vocab=384), device="meta")
    assert all(tensor.is_meta for tensor in weights.values())
    shapes = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    gdn, full = "model.language_model.layers.0.", "model.language_model.layers.3."
    key, value = 16 * 128, 48 * 128
    assert {name.removeprefix(gdn): shape for name, shape in shapes.items() if name.startswith(gdn)} == {
        "linear_attn.in_proj_qkv.weight": (2 * key + value, 5120), "linear_attn.in_proj_z.weight": (value, 5120),
        "linear_attn.in_proj_b.weight": (48, 5120), "linear_attn.in_proj_a.weight": (48, 5120),
        "linear_attn.conv1d.weight": (2 * key + value, 1, 4), "linear_attn.dt_bias": (48,),
        "linear_attn.A_log": (48,), "linear_attn.norm.weight": (128,), "linear_attn.out_proj.weight": (5120, value),
        "mlp.gate_proj.weight": (17408, 5120), "mlp.up_proj.weight": (17408, 5120),
        "mlp.down_proj.weight": (5120, 17408), "input_layernorm.weight": (5120,),
        "post_attention_layernorm.weight": (5120,)}
    assert {name.removeprefix(full): shape for name, shape in shapes.items()
            if name.startswith(full) and ".self_attn." in name} == {
        "self_attn.q_proj.weight": (2 * 24 * 256, 5120),  # queries and the output gate
        "self_attn.k_proj.weight": (4 * 256, 5120), "self_attn.v_proj.weight": (4 * 256, 5120),
        "self_attn.o_proj.weight": (5120, 24 * 256), "self_attn.q_norm.weight": (256,),
        "self_attn.k_norm.weight": (256,)}
    layers = {int(name.split(".")[3]) for name in shapes if name.startswith("model.language_model.layers.")}
    assert layers == set(range(8))
    assert sum(".linear_attn.in_proj_qkv." in name for name in shapes) == 6
    assert sum(".self_attn.q_proj." in name for name in shapes) == 2
    assert shapes["lm_head.weight"] == shapes["model.language_model.embed_tokens.weight"] == (384, 5120)
    assert any(name.startswith("model.visual.") for name in shapes)


def test_meta_build_matches_the_materialised_tiny_model():
    config = qwen3_5_config(_ARCHS["qwen3_5"], vocab=384)
    meta, materialised = qwen3_5_weights(config, device="meta"), qwen3_5_weights(config)
    assert {name: tensor.shape for name, tensor in meta.items()} == {
        name: tensor.shape for name, tensor in materialised.items()}
    # transformers' own initialisation: (1 + w) RMSNorms at zero, the gated GDN output norm at one
    assert not materialised["model.language_model.layers.0.input_layernorm.weight"].any()
    assert (materialised["model.language_model.layers.0.linear_attn.norm.weight"] == 1).all()


@pytest.mark.parametrize("mtp_layers", [0, 1], ids=["plain", "mtp"])
@pytest.mark.parametrize("fmt", ["ct-w4a16", "modelopt-mixed"])
def test_streamed_hybrid_checkpoint_is_valid_and_laid_out_like_the_dense_writer(tmp_path, fmt, mtp_layers):
    """stream_hybrid_checkpoint (full-depth benchmarks) writes what make_checkpoint writes for the same shape:
    the same tensor names, shapes and dtypes and the same quantization config (the MTP module excluded), a valid
    checkpoint, one shard per few layers."""
    from safetensors import safe_open

    from vllm_volta_fp4.format.checkpoint import Checkpoint
    from vllm_volta_fp4.testing.tiny_model import make_checkpoint, stream_hybrid_checkpoint, tiny_arch

    shape = dataclasses.replace(tiny_arch("qwen3_5"), mtp_layers=mtp_layers)
    lines = []
    streamed = stream_hybrid_checkpoint(tmp_path / "streamed", shape, fmt, layers_per_shard=2, progress=lines.append)
    dense = make_checkpoint(tmp_path / "dense", shape, fmt)
    Checkpoint(streamed).validate()

    def layout(path):
        index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
        found = {}
        for file in set(index.values()):
            with safe_open(str(path / file), "pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is no dict)
                    tensor = handle.get_slice(name)
                    found[name] = (tuple(tensor.get_shape()), tensor.get_dtype())
        return found

    assert layout(streamed) == layout(dense)
    assert any(name.startswith("mtp.") for name in layout(streamed)) == bool(mtp_layers)
    assert len(lines) == 1 + shape.layers // 2 + mtp_layers + 1  # embeddings + vision, layers, MTP, lm_head

    def quant_config(path):
        separate = path / "hf_quant_config.json"
        return json.loads(separate.read_text()) if separate.exists() else \
            json.loads((path / "config.json").read_text())["quantization_config"]

    assert quant_config(streamed) == quant_config(dense)
    config = json.loads((streamed / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == shape.layers
