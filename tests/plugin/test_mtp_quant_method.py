"""The quantization config gives the MTP draft model's layers the method the checkpoint's own exclusions say.

vLLM builds the MTP draft (Qwen3_5MTP, models/qwen3_5_mtp.py) with the target's quantization config object, after
the target model applied its weight-name mapper to it, and with no prefix, so its layers ask for ``mtp.fc`` and
``mtp.layers.N.{self_attn.qkv_proj, self_attn.o_proj, mlp.gate_up_proj, mlp.down_proj}`` (0.19.1, 0.20.2 and 0.32.0
alike; 0.20.2 and later pass no quantization config to fc for ``modelopt_fp4``, but do for ours). The CPU venv cannot
import the Qwen3.5 model files (they import torchvision), so the prefixes are checked against their source text."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import requires_vllm
from vllm_volta_fp4.testing.tiny_model import FORMATS, MTP_STORAGE

QWEN = Path(__file__).parents[1] / "data" / "qwen3.8-27b-config.json"
TINY = {"hidden": 256, "intermediate": 640, "heads": 8, "kv_heads": 2, "head_dim": 64}
MTP_PREFIX = "mtp.layers.0"


def _vllm_source(module: str) -> str:
    return Path(importlib.util.find_spec("vllm").submodule_search_locations[0], *module.split(".")).with_suffix(
        ".py").read_text()


def _target_mapper():
    """Qwen3_5ForConditionalGeneration.hf_to_vllm_mapper (Qwen3-VL's renames, mtp.* not loaded), as vLLM's
    configure_quant_config applies it: 0.32 drops the not-loaded entries first (get_rename_mapper)."""
    from vllm.model_executor.models.utils import WeightsMapper

    mapper = WeightsMapper(orig_to_new_prefix={"model.visual.": "visual.", "lm_head.": "language_model.lm_head.",
                                               "model.language_model.": "language_model.model.", "mtp.": None})
    return mapper.get_rename_mapper() if hasattr(mapper, "get_rename_mapper") else mapper


def _quant_config(hf_quant_config: dict):
    import vllm_volta_fp4
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    vllm_volta_fp4.register()
    config = VoltaNvfp4Config.from_config(hf_quant_config)
    config.apply_vllm_mapper(_target_mapper())  # the target model's load did this to the shared config
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                     "gate_up_proj": ["gate_proj", "up_proj"]}  # Qwen3_5MTP's
    return config


def _mtp_layers(config) -> dict:
    """The MTP module's linear layers as Qwen3_5MTP builds them (tiny widths), by prefix."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    h, i, heads, kv_heads, head_dim = TINY.values()
    return {
        "mtp.fc": ColumnParallelLinear(2 * h, h, bias=False, gather_output=True, quant_config=config,
                                       prefix="mtp.fc"),
        f"{MTP_PREFIX}.self_attn.qkv_proj": QKVParallelLinear(h, head_dim, 2 * heads, kv_heads, bias=False,
                                                              quant_config=config,
                                                              prefix=f"{MTP_PREFIX}.self_attn.qkv_proj"),
        f"{MTP_PREFIX}.self_attn.o_proj": RowParallelLinear(heads * head_dim, h, bias=False, quant_config=config,
                                                            prefix=f"{MTP_PREFIX}.self_attn.o_proj"),
        f"{MTP_PREFIX}.mlp.gate_up_proj": MergedColumnParallelLinear(h, [i, i], bias=False, quant_config=config,
                                                                     prefix=f"{MTP_PREFIX}.mlp.gate_up_proj"),
        f"{MTP_PREFIX}.mlp.down_proj": RowParallelLinear(i, h, bias=False, quant_config=config,
                                                         prefix=f"{MTP_PREFIX}.mlp.down_proj"),
    }


def _method_names(config) -> dict[str, str]:
    return {prefix: type(layer.quant_method).__name__ for prefix, layer in _mtp_layers(config).items()}


@requires_vllm
def test_the_mtp_prefixes_are_the_ones_vllm_builds():
    source = _vllm_source("model_executor.models.qwen3_5_mtp")
    assert 'maybe_prefix(prefix, "mtp")' in source  # the predictor, under get_model's empty prefix
    assert 'prefix=f"{prefix}.fc"' in source and 'prefix=f"{prefix}.layers.{idx}"' in source
    assert '"qkv_proj": [' in source and '"gate_up_proj": ["gate_proj", "up_proj"]' in source


@requires_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mtp", MTP_STORAGE)
def test_mtp_layers_get_the_checkpoints_method(simulated_tp, mtp_checkpoints, fmt, mtp):
    from vllm_volta_fp4.format.checkpoint import read_quant_config

    simulated_tp(0, 1)
    methods = _method_names(_quant_config(read_quant_config(mtp_checkpoints[(fmt, mtp)])[0]))
    assert methods.pop("mtp.fc") == "UnquantizedLinearMethod"  # 16 bits in every export
    if mtp == "unquantized":
        assert set(methods.values()) == {"UnquantizedLinearMethod"}
    elif fmt == "modelopt-mixed":  # FP8 attention, NVFP4 MLP, as in its main layers
        assert methods == {f"{MTP_PREFIX}.self_attn.qkv_proj": "Fp8LinearMethod",
                           f"{MTP_PREFIX}.self_attn.o_proj": "Fp8LinearMethod",
                           f"{MTP_PREFIX}.mlp.gate_up_proj": "NvFp4LinearMethod",
                           f"{MTP_PREFIX}.mlp.down_proj": "NvFp4LinearMethod"}
    else:
        assert set(methods.values()) == {"NvFp4LinearMethod"}


@requires_vllm
def test_real_27b_exclusions_leave_mtp_and_the_fused_gdn_b_a_projection_unquantized(simulated_tp):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    simulated_tp(0, 1)
    quantization = json.loads(QWEN.read_text())["quantization_config"]
    assert "*mtp*" in quantization["exclude_modules"]
    config = _quant_config(quantization)
    assert set(_method_names(config).values()) == {"UnquantizedLinearMethod"}
    config.packed_modules_mapping["in_proj_ba"] = ["in_proj_b", "in_proj_a"]
    b_a = MergedColumnParallelLinear(256, [16, 16], bias=False, quant_config=config,
                                     prefix="language_model.model.layers.0.linear_attn.in_proj_ba")
    assert type(b_a.quant_method).__name__ == "UnquantizedLinearMethod"


@requires_vllm
def test_modelopt_mtp_fc_missing_from_the_exclusions_stays_unquantized(simulated_tp):
    simulated_tp(0, 1)
    config = _quant_config({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}})  # the ModelOpt export bug
    methods = _method_names(config)
    assert methods.pop("mtp.fc") == "UnquantizedLinearMethod"
    assert set(methods.values()) == {"NvFp4LinearMethod"}
