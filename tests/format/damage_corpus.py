"""The damage corpus of the property suite: for a pristine tiny checkpoint, every damage it must refuse (or, for the
few that are harmless, still accept), each with its expectation. Shared by the inspect-level suite and the
vLLM-level one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from devkit import damage
from vllm_volta_fp4.testing.tiny_model import tiny_arch

# Layers whose tensors are damaged one by one: every layer of the two-layer models; of the hybrid one Gated-DeltaNet
# layer and one full-attention layer (the others repeat them)
_LAYERS = {"llama": (0, 1), "qwen3": (0, 1), "qwen3_5": (0, 3)}
_INPUT_SCALES = ("input_scale", "input_global_scale")  # optional: the plugin ignores them, so absence is harmless


def _selected(name: str, arch: str) -> bool:
    layer = re.search(r"\.layers\.(\d+)\.", name)
    if layer is not None:
        return int(layer.group(1)) in _LAYERS[arch]
    block = re.search(r"\.blocks\.(\d+)\.", name)
    return block is None or block.group(1) == "0"


_TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "U8": torch.uint8,
                 "F8_E4M3": torch.float8_e4m3fn}


def stored(model_dir: Path) -> dict[str, tuple[str, torch.dtype, tuple[int, ...]]]:
    """tensor → (shard, torch dtype, shape), from the headers."""
    out = {}
    for shard in sorted(set(damage.tensor_names(model_dir).values())):
        raw = (model_dir / shard).read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        out.update({name: (shard, _TORCH_DTYPES[entry["dtype"]], tuple(entry["shape"]))
                    for name, entry in header.items() if name != "__metadata__"})
    return out


def tensor_damages(model_dir: Path, arch: str) -> list[tuple[damage.Damage, bool]]:
    """(damage, must be refused) for each selected tensor: missing, wrong dtype, one dimension off by one."""
    cases = []
    names, headers = damage.tensor_names(model_dir), stored(model_dir)
    for position, (name, (shard, dtype, shape)) in enumerate(sorted(headers.items())):
        if not _selected(name, arch):
            continue
        cases.append((damage.missing(name, shard), not name.endswith(_INPUT_SCALES)))
        cases.append((damage.wrong_dtype(name, shard, dtype), True))
        dims = max(len(shape), 1)
        cases.append((damage.shape_off_by_one(name, shard, shape, position % dims, 1 if position % 2 else -1), True))
    modules = sorted({name.rpartition(".")[0] for name in names if _selected(name, arch)
                      and name.rpartition(".")[2] in ("weight", "weight_packed") and "visual" not in name
                      and len(headers[name][2]) == 2})
    cases += [(damage.missing_module(module, names), True) for module in modules]
    prefix = "model.language_model.layers" if arch == "qwen3_5" else "model.layers"
    cases.append((damage.extra_layer(prefix, tiny_arch(arch).layers, names), True))
    cases.append((damage.unexpected_tensor(f"{prefix}.0.mlp", names[f"{prefix}.0.mlp.down_proj.weight_scale"]), True))
    return cases


def _text(document: dict) -> dict:
    return document["text_config"] if "text_config" in document else document


def _set(path: tuple, value):
    def edit(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _delete(path: tuple):
    def edit(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return edit


def config_damages(model_dir: Path, fmt: str, arch: str) -> list[damage.Damage]:
    """Configs with fields missing, of the wrong type, or describing another model; all must be refused."""
    edit = damage.edit_json
    cases = [edit("config.json", "a JSON list", lambda d: []),
             edit("config.json", "num_hidden_layers missing", lambda d: _text(d).pop("num_hidden_layers") and None),
             edit("config.json", "hidden_size a string", lambda d: _text(d).update(hidden_size="320")),
             edit("config.json", "one layer fewer", lambda d: _text(d).update(
                 num_hidden_layers=_text(d)["num_hidden_layers"] - 1, **(
                     {"layer_types": _text(d)["layer_types"][:-1]} if "layer_types" in _text(d) else {}))),
             edit("config.json", "one layer more", lambda d: _text(d).update(
                 num_hidden_layers=_text(d)["num_hidden_layers"] + 1, **(
                     {"layer_types": [*_text(d)["layer_types"], "full_attention"]} if "layer_types" in _text(d)
                     else {}))),
             edit("config.json", "vocab_size + 1", lambda d: _text(d).update(vocab_size=_text(d)["vocab_size"] + 1))]
    if arch == "qwen3_5":
        cases += [edit("config.json", "text_config a string", _set(("text_config",), "x")),
                  edit("config.json", "layer_types too short", lambda d: d["text_config"].update(
                      layer_types=d["text_config"]["layer_types"][:-1])),
                  edit("config.json", "vision depth + 1", lambda d: d["vision_config"].update(
                      depth=d["vision_config"]["depth"] + 1))]
    if fmt == "modelopt-nvfp4":
        quant = "hf_quant_config.json"
        cases += [edit(quant, "a JSON string", lambda d: "garbage"),
                  edit(quant, "quantization a list", _set(("quantization",), [])),
                  edit(quant, "quant_algo missing", _delete(("quantization", "quant_algo"))),
                  edit(quant, "quant_algo a number", _set(("quantization", "quant_algo"), 4)),
                  edit(quant, "exclude_modules a number", _set(("quantization", "exclude_modules"), 5))]
        return cases
    q = ("quantization_config",)
    cases += [edit("config.json", "quantization_config: garbage", _set(q, "garbage")),
              edit("config.json", "quantization_config a list", _set(q, [1])),
              edit("config.json", "unknown quant_method", _set((*q, "quant_method"), "foo")),
              edit("config.json", "quant_method a number", _set((*q, "quant_method"), 7))]
    if fmt.startswith("ct"):
        group = (*q, "config_groups", "group_0")
        cases += [edit("config.json", "group without weights", _delete((*group, "weights"))),
                  edit("config.json", "config_groups empty", _set((*q, "config_groups"), {})),
                  edit("config.json", "config_groups a list", _set((*q, "config_groups"), ["group_0"])),
                  edit("config.json", "group a string", _set(group, "x")),
                  edit("config.json", "ignore a string", _set((*q, "ignore"), "lm_head")),
                  edit("config.json", "num_bits a string", _set((*group, "weights", "num_bits"), "4"))]
    else:
        cases += [edit("config.json", "quant_algo missing", _delete((*q, "quant_algo"))),
                  edit("config.json", "ignore a string", _set((*q, "ignore"), "lm_head"))]
        if fmt != "modelopt-mixed":  # a mixed config's own group_size is unused; its layers' are checked below
            cases.append(edit("config.json", "group_size a string", _set((*q, "group_size"), "16")))
        else:
            def layer_group_size(document):
                layers = document[q[0]]["quantized_layers"]
                next(info for info in layers.values() if info["quant_algo"] == "NVFP4")["group_size"] = "16"

            cases += [edit("config.json", "a layer's group_size a string", layer_group_size),
                      edit("config.json", "quantized_layers a list", _set((*q, "quantized_layers"), [])),
                      edit("config.json", "a layer missing from quantized_layers", lambda d: d[q[0]][
                          "quantized_layers"].pop(sorted(d[q[0]]["quantized_layers"])[0]) and None)]
    return cases


def config_has_quantization(model_dir: Path) -> bool:
    return "quantization_config" in json.loads((model_dir / "config.json").read_text())
