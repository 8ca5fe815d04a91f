"""The multi-token-prediction module in checkpoint validation: optional (vLLM reads it only when speculating), but
where it is stored every tensor is held to the shape config.json gives it, in its own quantization scheme."""

from __future__ import annotations

import pytest

from devkit import damage
from vllm_volta_fp4.format.checkpoint import Checkpoint, CheckpointError
from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint


@pytest.fixture(params=[("ct-w4a16", "unquantized"), ("modelopt-nvfp4", "nvfp4")], ids=lambda p: "-".join(p))
def mtp_checkpoint(request, tmp_path):
    fmt, mtp = request.param
    return make_tiny_checkpoint(tmp_path / f"{fmt}-{mtp}", "qwen3_5", fmt, mtp=mtp)


def test_a_checkpoint_without_its_mtp_module_is_still_valid(mtp_checkpoint):
    names = damage.tensor_names(mtp_checkpoint)
    for name in [n for n in names if n.startswith("mtp.")]:
        damage.missing(name, names[name]).apply(mtp_checkpoint)
    assert not any(n.startswith("mtp.") for n in damage.tensor_names(mtp_checkpoint))
    assert Checkpoint(mtp_checkpoint).validate()


@pytest.mark.parametrize("tensor", ["mtp.norm.weight", "mtp.layers.0.input_layernorm.weight"])
def test_a_stored_mtp_tensor_of_the_wrong_shape_is_refused(mtp_checkpoint, tensor):
    names = damage.tensor_names(mtp_checkpoint)
    info = Checkpoint(mtp_checkpoint).tensors[tensor]
    damage.shape_off_by_one(tensor, names[tensor], tuple(info.shape), 0, 1).apply(mtp_checkpoint)
    with pytest.raises(CheckpointError) as error:
        Checkpoint(mtp_checkpoint).validate()
    assert tensor in str(error.value)


def test_an_mtp_projection_of_the_wrong_shape_is_refused(mtp_checkpoint):
    names = damage.tensor_names(mtp_checkpoint)
    tensor = next(n for n in names if n.startswith("mtp.layers.0.mlp.down_proj.weight"))
    info = Checkpoint(mtp_checkpoint).tensors[tensor]
    damage.shape_off_by_one(tensor, names[tensor], tuple(info.shape), 0, 1).apply(mtp_checkpoint)
    with pytest.raises(CheckpointError) as error:
        Checkpoint(mtp_checkpoint).validate()
    assert "mtp.layers.0.mlp.down_proj" in str(error.value)
