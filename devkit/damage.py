"""Damaged copies of tiny checkpoints, for the property suite: every tensor missing, every dtype wrong, every shape
off by one, whole layers missing or extra, configs with fields missing or of the wrong type, bytes flipped in headers
and in scale data, truncated files.

A ``Damage`` names what it does and the tensor the refusal must name (None where the damage is not about one tensor:
configs, truncation inside a header); ``apply(model_dir)`` damages a private copy in place.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

INDEX = "model.safetensors.index.json"

# dtype each stored dtype is reinterpreted as (same element size: only the header changes)
_WRONG_DTYPE = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
                torch.uint8: torch.int8, torch.float8_e4m3fn: torch.uint8}


@dataclass(frozen=True)
class Damage:
    label: str
    apply: Callable[[Path], None]
    tensor: str | None = None  # the tensor the error message must name
    file: str | None = None  # the file name it must name (None: any file of the checkpoint)

    def __repr__(self) -> str:
        return self.label


def tensor_names(model_dir: Path) -> dict[str, str]:
    """tensor → shard file name."""
    return json.loads((model_dir / INDEX).read_text())["weight_map"]


def _rewrite_shard(model_dir: Path, shard: str, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = model_dir / shard
    with safe_open(path, framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    index = json.loads((model_dir / INDEX).read_text())
    index["weight_map"] = {name: file for name, file in index["weight_map"].items() if file != shard}
    index["weight_map"].update({name: shard for name in tensors})
    (model_dir / INDEX).write_text(json.dumps(index))


def missing(name: str, shard: str) -> Damage:
    return Damage(f"missing {name}", lambda d: _rewrite_shard(d, shard, lambda t: t.pop(name)), name)


def wrong_dtype(name: str, shard: str, dtype: torch.dtype) -> Damage:
    def change(tensors):
        tensors[name] = tensors[name].view(_WRONG_DTYPE[dtype])

    return Damage(f"{name} as {_WRONG_DTYPE[dtype]}", lambda d: _rewrite_shard(d, shard, change), name, shard)


def shape_off_by_one(name: str, shard: str, shape: tuple[int, ...], dim: int, delta: int) -> Damage:
    """Dimension ``dim`` one longer or shorter (a 0-d tensor becomes a two-element vector), filled with ones so the
    values stay valid and only the shape is wrong."""
    new_shape = list(shape) if shape else [1]
    new_shape[dim] += delta

    def change(tensors):
        tensors[name] = torch.ones(new_shape).to(tensors[name].dtype)

    return Damage(f"{name} shape {new_shape}", lambda d: _rewrite_shard(d, shard, change), name, shard)


def missing_module(module: str, names: dict[str, str]) -> Damage:
    """Every tensor of linear module ``module`` gone; the refusal names its first tensor (``expected``)."""
    def apply(model_dir: Path) -> None:
        for shard in sorted({file for name, file in names.items() if name.startswith(module + ".")}):
            _rewrite_shard(model_dir, shard, lambda t: [t.pop(n) for n in list(t) if n.startswith(module + ".")])

    return Damage(f"missing module {module}", apply)


def extra_layer(layer_prefix: str, layers: int, names: dict[str, str]) -> Damage:
    """A copy of layer 0 as layer ``layers`` (one more than config.json has)."""
    source, target = f"{layer_prefix}.0.", f"{layer_prefix}.{layers}."
    copied = sorted(name for name in names if name.startswith(source))
    shard = names[copied[0]]

    def apply(model_dir: Path) -> None:
        tensors = {}
        for name in copied:
            with safe_open(model_dir / names[name], framework="pt") as handle:
                tensors[target + name.removeprefix(source)] = handle.get_tensor(name)
        _rewrite_shard(model_dir, shard, lambda t: t.update(tensors))

    return Damage(f"extra layer {target}", apply, target + copied[0].removeprefix(source), shard)


def unexpected_tensor(module: str, shard: str) -> Damage:
    name = f"{module}.surplus"
    return Damage(f"unexpected {name}", lambda d: _rewrite_shard(d, shard, lambda t: t.update({name: torch.ones(4)})),
                  name, shard)


def edit_json(file: str, label: str, edit: Callable[[dict], object]) -> Damage:
    """``edit`` changes the parsed JSON in place and returns None, or returns a replacement for the whole document."""
    def apply(model_dir: Path) -> None:
        document = json.loads((model_dir / file).read_text())
        replaced = edit(document)
        (model_dir / file).write_text(json.dumps(document if replaced is None else replaced))

    return Damage(f"{file}: {label}", apply, None, file)


def header_span(path: Path) -> tuple[int, int, tuple[int, int] | None]:
    """(first header byte, end of header, the __metadata__ object's byte span inside the file or None)."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = raw[8:8 + size]
    start = header.find(b'"__metadata__":{')
    metadata = None if start < 0 else (8 + start, 8 + header.index(b"}", start) + 1)
    return 8, 8 + size, metadata


def flip_byte(shard: str, offset: int, mask: int) -> Damage:
    def apply(model_dir: Path) -> None:
        path = model_dir / shard
        raw = bytearray(path.read_bytes())
        raw[offset] ^= mask
        path.write_bytes(bytes(raw))

    return Damage(f"{shard} byte {offset} ^ {mask:#04x}", apply, None, shard)


def truncate(shard: str, length: int) -> Damage:
    def apply(model_dir: Path) -> None:
        path = model_dir / shard
        path.write_bytes(path.read_bytes()[:length])

    return Damage(f"{shard} truncated to {length} bytes", apply, None, shard)
