"""NVFP4 (either producer, mixed FP8 layers too) → plain Hugging Face checkpoint, for tools that cannot read NVFP4.

Streams one module at a time (memory bounded by the largest layer plus one output shard), writes sharded
safetensors with an index, drops the quantization config, copies tokenizer and generation files, then re-reads
every written tensor to verify it against a fresh dequantization.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vllm_volta_fp4.format.checkpoint import FP8, NVFP4, Checkpoint, CheckpointError
from vllm_volta_fp4.format.nvfp4 import dequantize_fp8, dequantize_nvfp4

_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
           "merges.txt", "generation_config.json", "chat_template.jinja", "preprocessor_config.json")


class Progress:
    """A one-line progress display on stderr (no dependency; quiet when stderr is not a terminal)."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr  # looked up now, so a stderr redirected after import is honoured
        self.interactive = self.stream.isatty()

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self.interactive or self.done == self.total:
            end = "\n" if self.done == self.total else ""
            print(f"\r{self.label}: {self.done}/{self.total} {note[:60]:<60}", end=end, file=self.stream, flush=True)


def _dense_plan(checkpoint: Checkpoint, dtype: torch.dtype,
                device: str = "cpu") -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """(output tensor name, loader) for the dense model; each loader reads one module, converts it on ``device``
    and returns it on the CPU."""
    modules = checkpoint.validate()
    plan, consumed = [], set()
    for module, scheme in modules.items():
        if scheme.kind == NVFP4:
            def load(module=module):
                weight = checkpoint.load_nvfp4(module)
                return dequantize_nvfp4(weight.packed.to(device), weight.block_scale.to(device),
                                        weight.global_scale.to(device), dtype).cpu()
        elif scheme.kind == FP8:
            def load(module=module):
                weight, scale = checkpoint.load_fp8(module)
                return dequantize_fp8(weight.to(device), scale.to(device), dtype=dtype).cpu()
        else:
            continue
        names = checkpoint.format.tensor_names(scheme)
        consumed.update(f"{module}.{leaf}" for leaf in (*names.values(), "weight_shape", "k_scale", "v_scale"))
        plan.append((f"{module}.weight", load))
    for name in sorted(set(checkpoint.tensors) - consumed):
        def load(name=name):
            tensor = checkpoint.load(name)
            return tensor.to(dtype) if tensor.is_floating_point() else tensor
        plan.append((name, load))
    return plan


_WRITTEN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors|model-\d{5}\.safetensors|model\.safetensors\.index\.json|"
                      r"config\.json|" + "|".join(re.escape(name) for name in _COPIED))
"""Every file name convert writes. --force replaces a directory holding only such files (a previous conversion)
and deletes nothing else: a destination with any other entry is refused, so no unrelated data can be lost."""


def _prepare_destination(src: Path, dst: Path, force: bool) -> None:
    """Refuse destinations that would overwrite the source or data convert did not write; clear a previous
    conversion when ``force``; create the directory."""
    source, target = src.resolve(), dst.resolve()
    if target == source or source in target.parents or target in source.parents:
        relation = ("is the source" if target == source else "is inside the source" if source in target.parents
                    else "contains the source")
        raise CheckpointError(f"{relation} ({source})", file=dst, fix="write the conversion to a separate directory")
    if dst.exists() and not dst.is_dir():
        raise CheckpointError("exists and is not a directory", file=dst, fix="choose a directory path")
    entries = sorted(dst.iterdir()) if dst.is_dir() else []
    if entries:
        if not force:
            raise CheckpointError("exists and is not empty", file=dst,
                                  fix="choose another directory, or pass --force to replace a previous conversion")
        foreign = [entry for entry in entries if not (entry.is_file() and _WRITTEN.fullmatch(entry.name))]
        if foreign:
            raise CheckpointError(f"holds '{foreign[0].name}', which convert did not write; --force replaces only a "
                                  "previous conversion", file=dst, fix="choose another directory or empty this one")
        for entry in entries:
            entry.unlink()
    try:
        dst.mkdir(parents=True, exist_ok=True)
        probe = dst / ".volta-fp4-write-test"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise CheckpointError(f"cannot be written ({error.strerror or error})", file=dst,
                              fix="choose a directory you can write to") from error


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def convert_to_dense(src: str | Path, dst: str | Path, *, dtype: torch.dtype = torch.float16,
                     shard_bytes: int = 4 << 30, force: bool = False, verify: bool = True,
                     device: str = "cpu") -> Path:
    """Write the dequantized model of checkpoint ``src`` to ``dst``; returns ``dst``. ``device`` is where the
    weights are dequantized (a GPU is much faster for large models); the files are the same either way. The source
    is validated completely (as ``inspect`` does) before anything is written."""
    src, dst = Path(src), Path(dst)
    checkpoint = Checkpoint(src)
    plan = _dense_plan(checkpoint, dtype, device)
    _prepare_destination(src, dst, force)
    progress = Progress(len(plan), "convert")
    shard: dict[str, torch.Tensor] = {}
    shard_files: list[tuple[str, list[str]]] = []

    def flush() -> None:
        if shard:
            file = f"model-{len(shard_files) + 1:05d}.safetensors"
            save_file(shard, str(dst / file), metadata={"format": "pt"})
            shard_files.append((file, list(shard)))
            shard.clear()

    for name, load in plan:
        tensor = load()
        shard_size = sum(t.numel() * t.element_size() for t in shard.values())
        if shard and shard_size + tensor.numel() * tensor.element_size() > shard_bytes:
            flush()
        shard[name] = tensor.contiguous()
        progress.advance(name)
    flush()
    _write_index_and_files(src, dst, shard_files, dtype)
    if verify:
        verify_dense(plan, dst)
    return dst


def _write_index_and_files(src: Path, dst: Path, shard_files: list[tuple[str, list[str]]], dtype: torch.dtype) -> None:
    count = len(shard_files)
    weight_map, total = {}, 0
    for index, (file, names) in enumerate(shard_files):
        final = f"model-{index + 1:05d}-of-{count:05d}.safetensors"
        (dst / file).rename(dst / final)
        weight_map.update({name: final for name in names})
        total += (dst / final).stat().st_size
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    _set_dtype(config, str(dtype).removeprefix("torch."))
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    for name in _COPIED:
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)
    mode = 0o666 & ~_umask()  # safetensors creates its files 0600; the user's umask decides, as for any file
    for file in dst.iterdir():
        file.chmod(mode)


def _set_dtype(config: dict, dtype: str) -> None:
    """Current transformers reads ``dtype``, older ones ``torch_dtype``: both say the dtype written, at the top and
    in any sub-config (text_config, vision_config) that names one."""
    config["dtype"] = config["torch_dtype"] = dtype
    for sub in config.values():
        if isinstance(sub, dict) and ("dtype" in sub or "torch_dtype" in sub):
            sub["dtype"] = sub["torch_dtype"] = dtype


def verify_dense(plan: list[tuple[str, Callable[[], torch.Tensor]]], dst: Path) -> None:
    """Re-read every written tensor and compare it with a fresh conversion; raise on any difference."""
    index_file = dst / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())["weight_map"]
    if set(index) != {name for name, _ in plan}:
        raise CheckpointError("the written index does not list exactly the converted tensors", file=index_file)
    progress = Progress(len(plan), "verify")
    for name, load in plan:
        with safe_open(dst / index[name], framework="pt") as handle:
            if not torch.equal(handle.get_tensor(name), load()):
                raise CheckpointError("verification failed: the written tensor differs", file=dst / index[name],
                                      tensor=name)
        progress.advance(name)
