"""Tiny Qwen3.5 checkpoints with an MTP module: the ``mtp.*`` tensors vLLM's Qwen3_5MTP loads, the config's
mtp_num_hidden_layers, and the MTP module excluded from quantization as real exports exclude it (or NVFP4 too)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from vllm_volta_fp4.format.checkpoint import FP8, NVFP4, UNQUANTIZED, Checkpoint, read_quant_config  # noqa: E402
from vllm_volta_fp4.testing.tiny_model import FORMATS, MTP_STORAGE, make_tiny_checkpoint, tiny_arch  # noqa: E402

# What vLLM's Qwen3_5MTP.load_weights takes from a checkpoint (models/qwen3_5_mtp.py, 0.19.1 to 0.32.0): mtp.* renamed
# to its predictor, plus the main model's embed_tokens and lm_head.
MTP_LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
             "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
             "post_attention_layernorm"]
MTP_MODULES = {"mtp.fc", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.norm",
               *(f"mtp.layers.0.{name}" for name in MTP_LAYER)}
MTP_PROJECTIONS = [f"mtp.layers.0.{name}" for name in MTP_LAYER if name.endswith("proj")]


def _mtp_modules(checkpoint: Checkpoint) -> set[str]:
    return {name.rpartition(".")[0] for name in checkpoint.tensors if name.startswith("mtp.")}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mtp", MTP_STORAGE)
def test_mtp_module_is_laid_out_as_real_exports_and_validates(mtp_checkpoints, fmt, mtp):
    model_dir = mtp_checkpoints[(fmt, mtp)]
    config = json.loads((model_dir / "config.json").read_text())
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    checkpoint = Checkpoint(model_dir)
    assert _mtp_modules(checkpoint) == MTP_MODULES
    schemes = checkpoint.validate()
    assert schemes["mtp.fc"].kind == UNQUANTIZED
    assert tuple(checkpoint.tensors["mtp.fc.weight"].shape) == (256, 512)  # fc: [hidden, 2 · hidden]
    # the MTP decoder layer has the shapes of the main model's full-attention layer (vLLM builds it as one)
    full = "model.language_model.layers.3."
    for name in MTP_PROJECTIONS:
        mtp_info, main_info = checkpoint.tensors.get(f"{name}.weight"), None
        main_name = full + name.removeprefix("mtp.layers.0.")
        for leaf in ("weight", "weight_packed"):
            main_info = main_info or checkpoint.tensors.get(f"{main_name}.{leaf}")
            mtp_info = mtp_info or checkpoint.tensors.get(f"{name}.{leaf}")
        if mtp == "unquantized":
            assert schemes[name].kind == UNQUANTIZED and mtp_info.dtype == "F16"
            assert main_info.shape[0] == mtp_info.shape[0]  # same output rows; the main one is packed
        else:
            assert schemes[name] == schemes[main_name] and schemes[name].kind in (NVFP4, FP8)
            assert tuple(main_info.shape) == tuple(mtp_info.shape) and main_info.dtype == mtp_info.dtype


@pytest.mark.parametrize("fmt", FORMATS)
def test_mtp_exclusions_are_the_real_exports_patterns(mtp_checkpoints, fmt):
    for mtp in MTP_STORAGE:
        quant, _ = read_quant_config(mtp_checkpoints[(fmt, mtp)])
        body = quant.get("quantization", quant)
        excluded = body.get("exclude_modules") or body.get("ignore")
        pattern = "*mtp*" if fmt.startswith("modelopt") else "re:.*mtp.*"
        if mtp == "unquantized":
            assert pattern in excluded and "mtp.fc" not in excluded
        else:
            assert pattern not in excluded and "mtp.fc" in excluded


def test_without_mtp_nothing_changes(tmp_path):
    plain = make_tiny_checkpoint(tmp_path / "plain", "qwen3_5", "modelopt-w4a16")
    assert not _mtp_modules(Checkpoint(plain))
    assert json.loads((plain / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 0
    assert "*mtp*" not in read_quant_config(plain)[0]["ignore"]
    assert tiny_arch("qwen3_5").mtp_layers == 0


def test_mtp_only_for_qwen3_5(tmp_path):
    with pytest.raises(ValueError, match="qwen3_5"):
        make_tiny_checkpoint(tmp_path / "x", "llama", "modelopt-nvfp4", mtp="unquantized")
    with pytest.raises(ValueError, match="qwen3_5"):
        make_tiny_checkpoint(tmp_path / "y", "qwen3_5", "modelopt-nvfp4", mtp="fp8")
