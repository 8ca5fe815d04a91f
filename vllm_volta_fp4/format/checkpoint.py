"""Recognise NVFP4 checkpoints as published and present every producer's layers in one canonical form.

Producers understood:
  * NVIDIA ModelOpt: ``hf_quant_config.json`` ``{"producer": {"name": "modelopt"}, "quantization": {...}}`` or the
    same keys flat in config.json's ``quantization_config`` (``quant_method: modelopt``); ``quant_algo`` NVFP4
    (W4A4), W4A16_NVFP4, FP8, or MIXED_PRECISION with a per-layer ``quantized_layers`` table.
    Tensors: NVFP4 ``weight`` u8 [N,K/2], ``weight_scale`` e4m3 [N,K/16], ``weight_scale_2`` f32 decode scale,
    ``input_scale``; FP8 ``weight`` e4m3 [N,K], ``weight_scale`` f32 per tensor or per row, ``input_scale``.
  * compressed-tensors (llm-compressor): ``quantization_config.format == "nvfp4-pack-quantized"`` (or per group,
    for mixed-precision), ``config_groups`` with ``tensor_group`` FP4 weights, ``ignore`` list.
    Tensors: ``weight_packed``, ``weight_scale``, ``weight_global_scale`` (the *encode* scale: decode = 1/x),
    ``input_global_scale``; FP8 groups ``weight``, ``weight_scale``, ``input_scale``.

Downstream code sees ``NvFp4Weight`` (decode scale) and FP8 (weight, scale) only. Validation reads headers and the
small scale tensors, never whole weights, and raises ``CheckpointError`` naming file, tensor and the fix.
No vLLM import here.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from vllm_volta_fp4.format.architecture import (
    ConfigFieldError,
    ModelSpec,
    architecture_of,
    known_architectures,
    model_spec,
)
from vllm_volta_fp4.format.nvfp4 import BLOCK_SIZE, NvFp4Weight

NVFP4 = "nvfp4"
FP8 = "fp8"
UNQUANTIZED = "unquantized"

MODELOPT = "modelopt"
COMPRESSED_TENSORS = "compressed-tensors"

NVFP4_FORMAT_CT = "nvfp4-pack-quantized"
FP8_FORMATS_CT = ("float-quantized", "naive-quantized")

# Tensors a KV-cache-quantized attention stores on its k/v projections; read by nobody here (fp16 KV cache).
_KV_CACHE_SCALES = ("k_scale", "v_scale")


class CheckpointError(ValueError):
    """A checkpoint that cannot be served, with the file, the tensor and what to do."""

    def __init__(self, problem: str, *, file: str | Path | None = None, tensor: str | None = None, fix: str = ""):
        self.file, self.tensor, self.problem, self.fix = (str(file) if file else None), tensor, problem, fix
        where = ": ".join(part for part in (self.file, f"tensor '{tensor}'" if tensor else None) if part)
        super().__init__(f"{where + ': ' if where else ''}{problem}{'. ' + fix if fix else ''}")


@dataclass(frozen=True)
class LayerScheme:
    """How one linear module is stored. ``quantized_activations`` marks W4A4 / W8A8 checkpoints, which this
    plugin runs weight-only (their input scales are read and ignored)."""

    kind: str
    quantized_activations: bool = False
    per_channel: bool = False  # FP8 only: one weight scale per output row instead of one per tensor

    @property
    def tensor_roles(self) -> tuple[str, ...]:
        return {NVFP4: ("packed", "block_scale", "global_scale"), FP8: ("weight", "scale"), UNQUANTIZED: ("weight",)}[
            self.kind
        ]


UNQUANTIZED_SCHEME = LayerScheme(UNQUANTIZED)

# Canonical role → tensor suffix, per producer. The input scale is optional everywhere.
_TENSOR_NAMES = {
    (MODELOPT, NVFP4): {"packed": "weight", "block_scale": "weight_scale", "global_scale": "weight_scale_2",
                        "input_scale": "input_scale"},
    (COMPRESSED_TENSORS, NVFP4): {"packed": "weight_packed", "block_scale": "weight_scale",
                                  "global_scale": "weight_global_scale", "input_scale": "input_global_scale"},
    (MODELOPT, FP8): {"weight": "weight", "scale": "weight_scale", "input_scale": "input_scale"},
    (COMPRESSED_TENSORS, FP8): {"weight": "weight", "scale": "weight_scale", "input_scale": "input_scale"},
}


@dataclass
class QuantFormat:
    """A parsed quantization config: which producer, which algorithm, and the scheme of any module."""

    producer: str
    algorithm: str
    exclude: list[str] = field(default_factory=list)
    default_scheme: LayerScheme = UNQUANTIZED_SCHEME
    layer_schemes: dict[str, LayerScheme] = field(default_factory=dict)
    # compressed-tensors: (targets, scheme) per config group, first match wins
    target_groups: list[tuple[list[str], LayerScheme]] = field(default_factory=list)

    @property
    def global_scale_is_inverse(self) -> bool:
        return self.producer == COMPRESSED_TENSORS

    def tensor_names(self, scheme: LayerScheme) -> dict[str, str]:
        if scheme.kind == UNQUANTIZED:
            return {"weight": "weight"}
        return _TENSOR_NAMES[(self.producer, scheme.kind)]

    def is_excluded(self, module: str) -> bool:
        for pattern in self.exclude:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], module):
                    return True
            elif module == pattern or fnmatch.fnmatchcase(module, pattern) or module.endswith("." + pattern):
                return True
            # ModelOpt writes "a.b*" to mean the module a.b and everything below it.
            elif pattern.endswith("*") and not pattern.endswith(".*") and module == pattern[:-1]:
                return True
        return False

    def scheme_for(self, module: str) -> LayerScheme:
        """The storage scheme of checkpoint module ``module`` (an unfused name such as ...q_proj)."""
        if self.is_excluded(module):
            return UNQUANTIZED_SCHEME
        if self.layer_schemes or self.algorithm == "MIXED_PRECISION":
            return self.layer_schemes.get(module, UNQUANTIZED_SCHEME)
        for targets, scheme in self.target_groups:
            if any(_target_matches(target, module) for target in targets):
                return scheme
        return self.default_scheme

    def scheme_for_fused(self, module: str, shard_names: list[str] | None) -> LayerScheme:
        """Scheme of a module that vLLM may have fused (qkv_proj ← q/k/v_proj): every shard must agree."""
        if not shard_names:
            return self.scheme_for(module)
        parent, _, _ = module.rpartition(".")
        schemes = {name: self.scheme_for(f"{parent}.{name}" if parent else name) for name in shard_names}
        if len(set(schemes.values())) > 1:
            detail = ", ".join(f"{name}: {scheme.kind}" for name, scheme in schemes.items())
            raise CheckpointError(
                f"the shards fused into '{module}' are stored differently ({detail})",
                fix="vLLM fuses these projections into one layer; quantize them alike",
            )
        return next(iter(schemes.values()))


def _target_matches(target: str, module: str) -> bool:
    if target == "Linear":  # compressed-tensors' class target; every module we are asked about is a linear
        return True
    if target.startswith("re:"):
        return re.fullmatch(target[3:], module) is not None
    return module == target or module.endswith("." + target)


_MODELOPT_ALGORITHMS = {
    "NVFP4": LayerScheme(NVFP4, quantized_activations=True),
    "W4A16_NVFP4": LayerScheme(NVFP4),
    "FP8": LayerScheme(FP8, quantized_activations=True),
    "FP8_PER_CHANNEL_PER_TOKEN": LayerScheme(FP8, quantized_activations=True, per_channel=True),
}


def _modelopt_scheme(algorithm: str, group_size, where: str) -> LayerScheme:
    algorithm = str(algorithm).upper()
    if algorithm not in _MODELOPT_ALGORITHMS:
        raise CheckpointError(
            f"ModelOpt quant_algo '{algorithm}' is not supported (supported: "
            f"{', '.join(_MODELOPT_ALGORITHMS)}, MIXED_PRECISION)",
            file=where,
            fix="volta_nvfp4 serves NVFP4 checkpoints and the FP8 layers of mixed ones",
        )
    scheme = _MODELOPT_ALGORITHMS[algorithm]
    if scheme.kind == NVFP4 and group_size not in (None, BLOCK_SIZE):
        raise CheckpointError(f"NVFP4 group_size {group_size} is not {BLOCK_SIZE}", file=where,
                              fix="NVFP4 always uses 16-element blocks; the config is inconsistent")
    return scheme


def _parse_modelopt(config: Mapping, where: str) -> QuantFormat:
    body = config["quantization"] if isinstance(config.get("quantization"), Mapping) else config
    algorithm = str(body.get("quant_algo") or "").upper()
    if not algorithm:
        raise CheckpointError("ModelOpt config has no quant_algo", file=where,
                              fix="the checkpoint's quantization config is incomplete; re-export it with ModelOpt")
    exclude = _string_list(body.get("exclude_modules") or body.get("ignore") or [], "exclude_modules", where)
    if algorithm == "MIXED_PRECISION":
        layers = body.get("quantized_layers") or {}
        if not layers:
            raise CheckpointError("MIXED_PRECISION config has no quantized_layers table", file=where,
                                  fix="the per-layer table is required to know how each layer is stored")
        schemes = {name: _modelopt_scheme(info.get("quant_algo", ""), info.get("group_size"), where)
                   for name, info in layers.items()}
        return QuantFormat(MODELOPT, algorithm, exclude, UNQUANTIZED_SCHEME, schemes)
    scheme = _modelopt_scheme(algorithm, body.get("group_size"), where)
    if scheme.kind != NVFP4:
        raise CheckpointError(f"this is a ModelOpt {algorithm} checkpoint, not NVFP4", file=where,
                              fix="serve it with vLLM's own 'modelopt' method; volta_nvfp4 is for NVFP4 checkpoints")
    return QuantFormat(MODELOPT, algorithm, exclude, scheme)


def _string_list(value, key: str, where: str) -> list[str]:
    if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        raise CheckpointError(f"'{key}' is {value!r}, not a list of module names", file=where,
                              fix="the checkpoint's quantization config is damaged")
    return value


def _ct_group_scheme(name: str, group: Mapping, group_format: str | None, where: str) -> LayerScheme:
    if not isinstance(group, Mapping):
        raise CheckpointError(f"config group '{name}' is a {type(group).__name__}, not an object", file=where,
                              fix="the checkpoint's quantization config is damaged")
    weights = group.get("weights")
    if not isinstance(weights, Mapping):
        raise CheckpointError(f"config group '{name}' has no 'weights' section", file=where,
                              fix="the checkpoint's quantization config is incomplete; re-export it")
    inputs = group.get("input_activations") or {}
    bits, kind = weights.get("num_bits"), weights.get("type")
    if bits == 4 and kind == "float":
        if weights.get("group_size") != BLOCK_SIZE or weights.get("strategy") not in ("tensor_group", "group"):
            raise CheckpointError(
                f"config group '{name}' is FP4 but not NVFP4 (strategy {weights.get('strategy')}, "
                f"group_size {weights.get('group_size')}); MXFP4 and other FP4 layouts are not supported",
                file=where, fix="use an NVFP4 (tensor_group, group_size 16) checkpoint")
        if weights.get("symmetric") is False:
            raise CheckpointError(f"config group '{name}' is asymmetric FP4", file=where,
                                  fix="NVFP4 is symmetric; asymmetric FP4 is not supported")
        if group_format not in (None, NVFP4_FORMAT_CT):
            raise CheckpointError(f"config group '{name}' is FP4 stored as '{group_format}'", file=where,
                                  fix=f"only the '{NVFP4_FORMAT_CT}' storage format is supported")
        return LayerScheme(NVFP4, quantized_activations=inputs.get("num_bits") == 4)
    if bits == 8 and kind == "float":
        if weights.get("strategy") not in ("tensor", "channel"):
            raise CheckpointError(f"config group '{name}': FP8 strategy '{weights.get('strategy')}' is not supported",
                                  file=where, fix="FP8 layers must be per-tensor or per-channel")
        return LayerScheme(FP8, quantized_activations=bool(inputs), per_channel=weights["strategy"] == "channel")
    raise CheckpointError(
        f"config group '{name}' quantizes weights to {bits}-bit {kind}, which volta_nvfp4 does not serve",
        file=where, fix="use an NVFP4 checkpoint (optionally with FP8 layers)")


def _parse_compressed_tensors(config: Mapping, where: str) -> QuantFormat:
    top_format = config.get("format")
    groups = config.get("config_groups") or {}
    if not groups:
        raise CheckpointError("compressed-tensors config has no config_groups", file=where,
                              fix="the checkpoint's quantization config is incomplete")
    if top_format not in (NVFP4_FORMAT_CT, "mixed-precision", *FP8_FORMATS_CT):
        raise CheckpointError(f"compressed-tensors format '{top_format}' is not NVFP4", file=where,
                              fix=f"volta_nvfp4 serves '{NVFP4_FORMAT_CT}' checkpoints")
    target_groups = []
    for name, group in groups.items():
        group_format = group.get("format") or (top_format if top_format != "mixed-precision" else None)
        target_groups.append((list(group.get("targets") or []), _ct_group_scheme(name, group, group_format, where)))
    if not any(scheme.kind == NVFP4 for _, scheme in target_groups):
        raise CheckpointError("no compressed-tensors config group is NVFP4", file=where,
                              fix="serve FP8-only checkpoints with vLLM's own compressed-tensors method")
    return QuantFormat(COMPRESSED_TENSORS, top_format, _string_list(config.get("ignore") or [], "ignore", where),
                       UNQUANTIZED_SCHEME,
                       target_groups=target_groups)


# quant_method strings the producers (and vLLM's normalisation of them) write; hf_quant_config.json has none.
_MODELOPT_METHODS = ("modelopt", "modelopt_fp4", "modelopt_mixed")
_READ_FIX = "volta_nvfp4 reads ModelOpt and compressed-tensors NVFP4 checkpoints"


def parse_quant_config(config: Mapping, where: str = "quantization config") -> QuantFormat:
    """Recognise a quantization config dict (hf_quant_config.json, or config.json's quantization_config).
    Anything malformed, of any type, ends in one CheckpointError."""
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the quantization config is a {type(config).__name__} ({str(config)[:40]!r}), not a "
                              "JSON object", file=where, fix="the config is damaged; download it again")
    method = config.get("quant_method")
    if method is not None and not isinstance(method, str):
        raise CheckpointError(f"quant_method is {method!r}, not a string", file=where, fix=_READ_FIX)
    method = (method or "").lower()
    if method and method not in (*_MODELOPT_METHODS, COMPRESSED_TENSORS):
        raise CheckpointError(f"unknown quantization config (quant_method '{method}')", file=where, fix=_READ_FIX)
    producer = config.get("producer")
    producer = str(producer.get("name") or "").lower() if isinstance(producer, Mapping) else ""
    try:
        if producer == MODELOPT or method in _MODELOPT_METHODS or "quantization" in config:
            return _parse_modelopt(config, where)
        if method == COMPRESSED_TENSORS or "config_groups" in config:
            return _parse_compressed_tensors(config, where)
    except (AttributeError, TypeError, KeyError) as error:  # a field of the wrong type somewhere in the tree
        raise CheckpointError(f"the quantization config is malformed ({type(error).__name__}: {error})", file=where,
                              fix="the config is damaged or hand-edited; restore the producer's original") from error
    raise CheckpointError(f"unknown quantization config (quant_method '{method or 'missing'}')", file=where,
                          fix=_READ_FIX)


def read_model_config(model_dir: str | Path) -> dict:
    """config.json of a model directory (every checkpoint needs one: it names the architecture)."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise CheckpointError("no config.json", file=model_dir, fix="point at a Hugging Face model directory")
    return _read_json(path)


def read_quant_config(model_dir: str | Path) -> tuple[dict, Path]:
    """The quantization config of a model directory and the file it came from."""
    model_dir = Path(model_dir)
    config = read_model_config(model_dir)
    path = model_dir / "hf_quant_config.json"
    if path.exists():
        return _read_json(path), path
    path = model_dir / "config.json"
    if "quantization_config" not in config or config["quantization_config"] in (None, {}):
        raise CheckpointError("config.json has no quantization_config and there is no hf_quant_config.json",
                              file=path, fix="this model is not quantized; serve it without --quantization")
    return config["quantization_config"], path


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot be read as JSON ({error})", file=path,
                              fix="the file is damaged; download it again") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"holds a JSON {type(value).__name__}, not an object", file=path,
                              fix="the file is damaged; download it again")
    return value


_FLOAT_DTYPES = ("F16", "BF16", "F32")


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]


class Checkpoint:
    """A model directory opened lazily: headers are read at open, tensors one at a time on demand."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CheckpointError("is not a directory", file=self.model_dir, fix="point at a model directory")
        quant, self.config_file = read_quant_config(self.model_dir)
        self.model_config = read_model_config(self.model_dir)
        self.format = parse_quant_config(quant, str(self.config_file))
        self.tensors = self._read_headers()
        self.notes: list[str] = []  # what validate() could not check, for the user to know

    def _shard_files(self) -> dict[Path, list[str] | None]:
        """Shard file → tensor names the index puts there (None: no index, take the file's own header)."""
        index = self.model_dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError("has no weight_map", file=index, fix="the index is damaged; download it again")
            shards: dict[Path, list[str]] = {}
            for tensor, shard in weight_map.items():
                shards.setdefault(self.model_dir / shard, []).append(tensor)
            for shard, names in shards.items():
                if not shard.exists():
                    raise CheckpointError(f"the index lists shard '{shard.name}', which is missing", file=index,
                                          tensor=names[0], fix="download the missing shard")
            return shards
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError("no *.safetensors files", file=self.model_dir,
                                  fix="volta_nvfp4 reads safetensors checkpoints only")
        return {path: None for path in files}

    def _read_headers(self) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for path, expected in self._shard_files().items():
            header = _read_safetensors_header(path)
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                tensors[name] = TensorInfo(path, entry["dtype"], tuple(entry["shape"]))
            for name in expected or []:
                if name not in header:
                    raise CheckpointError("listed in the index but not in this shard", file=path, tensor=name,
                                          fix="the shard and the index disagree; download both again")
        return tensors

    def load(self, name: str) -> torch.Tensor:
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError("missing tensor", file=self.model_dir, tensor=name,
                                  fix="the checkpoint is incomplete; download it again")
        try:
            with safe_open(info.file, framework="pt") as handle:
                return handle.get_tensor(name)
        except Exception as error:  # safetensors raises its own error types for damaged files
            raise CheckpointError(f"cannot be read ({error})", file=info.file, tensor=name,
                                  fix="the file is damaged or truncated; download it again") from error

    def linear_modules(self) -> dict[str, LayerScheme]:
        """Every module that stores a weight matrix, with the scheme the config gives it.

        Configs say "every Linear except ..." and a checkpoint does not say which matrices are Linear layers, so a
        module holding only a float ``weight`` (and ``bias``) that the config does not name explicitly is taken as
        stored unquantized: embeddings, or layers the producer skipped. Anything else is held to its scheme."""
        leaves: dict[str, set[str]] = {}
        for name in self.tensors:
            module, _, leaf = name.rpartition(".")
            leaves.setdefault(module, set()).add(leaf)
        modules = {}
        for module, present in sorted(leaves.items()):
            weight = self.tensors.get(f"{module}.weight")
            if not ((weight is not None and len(weight.shape) == 2) or "weight_packed" in present):
                continue
            scheme = self.format.scheme_for(module)
            plain_float = present <= {"weight", "bias"} and weight.dtype in _FLOAT_DTYPES
            if scheme.kind != UNQUANTIZED and plain_float and module not in self.format.layer_schemes:
                scheme = UNQUANTIZED_SCHEME
            modules[module] = scheme
        return modules

    def quantized_modules(self) -> dict[str, LayerScheme]:
        return {name: scheme for name, scheme in self.linear_modules().items() if scheme.kind != UNQUANTIZED}

    def _name(self, module: str, scheme: LayerScheme, role: str) -> str:
        return f"{module}.{self.format.tensor_names(scheme)[role]}"

    def load_nvfp4(self, module: str) -> NvFp4Weight:
        """One NVFP4 module in canonical form, with the *decode* global scale whichever producer wrote it."""
        scheme = LayerScheme(NVFP4)
        global_scale = self.load(self._name(module, scheme, "global_scale")).to(torch.float32).reshape(())
        if self.format.global_scale_is_inverse:
            global_scale = 1.0 / global_scale
        return NvFp4Weight(self.load(self._name(module, scheme, "packed")),
                           self.load(self._name(module, scheme, "block_scale")), global_scale)

    def load_fp8(self, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        scheme = LayerScheme(FP8)
        scale = self.load(self._name(module, scheme, "scale")).to(torch.float32)
        weight = self.load(self._name(module, scheme, "weight"))
        return weight, scale.reshape(-1) if scale.numel() > 1 else scale.reshape(())

    def validate(self) -> dict[str, LayerScheme]:
        """Check the checkpoint against the model config.json describes (every tensor its architecture needs, with
        the right dtype and shape, nothing else) and every quantized module against its scheme (names, dtypes,
        shapes, scale values); raise at the first problem. Returns the module → scheme table."""
        modules = self.linear_modules()
        spec = self.model_spec()
        if spec is None:
            self.notes.append(
                f"architecture {architecture_of(self.model_config) or '(none given)'} is not one volta-fp4 knows "
                f"({', '.join(known_architectures())}): tensors were checked against the quantization config only, "
                "not against the model's layer list")
        else:
            ModelCheck(self, spec, modules).run()
        for module, scheme in self.format.layer_schemes.items():
            if not self.format.is_excluded(module) and module not in modules:
                raise CheckpointError(
                    f"the quantization config lists module '{module}' as {scheme.kind}, but the checkpoint has no "
                    "weight for it", file=self.config_file, tensor=self._name(module, scheme, scheme.tensor_roles[0]),
                    fix="the checkpoint is incomplete or the config belongs to another model")
        for module, scheme in modules.items():
            self._validate_module(module, scheme)
        return modules

    def _validate_module(self, module: str, scheme: LayerScheme) -> None:
        names = self.format.tensor_names(scheme)
        present = {name.rpartition(".")[2] for name in self.tensors if name.rpartition(".")[0] == module}
        for role in scheme.tensor_roles:
            if names[role] not in present:
                expected = "stored unquantized" if scheme.kind == UNQUANTIZED else f"{scheme.kind}"
                raise CheckpointError(
                    f"missing tensor: the quantization config ({self.config_file.name}) says '{module}' is {expected}",
                    file=self._file_of(module, present), tensor=f"{module}.{names[role]}",
                    fix="the checkpoint is incomplete or does not match its quantization config")
        allowed = set(names.values()) | {"bias", "weight_shape", *_KV_CACHE_SCALES}
        for extra in sorted(present - allowed):
            raise CheckpointError(
                f"unexpected tensor for a {scheme.kind} layer (the quantization config, {self.config_file.name}, "
                f"says '{module}' is {scheme.kind})", file=self._file_of(module, present),
                tensor=f"{module}.{extra}",
                fix="the checkpoint does not match its quantization config (wrong producer or scheme?)")
        if scheme.kind == NVFP4:
            self._validate_nvfp4(module, names)
        elif scheme.kind == FP8:
            self._validate_fp8(module, names)
        else:
            info = self.tensors[f"{module}.weight"]
            if info.dtype not in _FLOAT_DTYPES:
                raise CheckpointError(
                    f"weight has dtype {info.dtype}, but the quantization config leaves this module unquantized",
                    file=info.file, tensor=f"{module}.weight",
                    fix="the checkpoint does not match its quantization config (check exclude_modules / ignore)")
        if "input_scale" in names and names["input_scale"] in present:
            self._validate_positive_scalar(f"{module}.{names['input_scale']}", "input scale")

    def model_spec(self) -> ModelSpec | None:
        """What config.json's architecture needs, or None for an architecture not in the table."""
        try:
            return model_spec(self.model_config)
        except ConfigFieldError as error:
            raise CheckpointError(f"{architecture_of(self.model_config)}: {error}", file=self.model_dir / "config.json",
                                  fix="config.json is damaged or incomplete; restore the original") from error

    def listing_file(self) -> Path:
        """The file that says which tensors the checkpoint has: the index, or the directory when there is none."""
        index = self.model_dir / "model.safetensors.index.json"
        return index if index.exists() else self.model_dir

    def _file_of(self, module: str, present: set[str]) -> Path:
        return self.tensors[f"{module}.{sorted(present)[0]}"].file if present else self.model_dir

    def _expect(self, name: str, dtype: str, shape: tuple[int, ...] | None, what: str) -> TensorInfo:
        info = self.tensors[name]
        if info.dtype != dtype:
            raise CheckpointError(f"{what} has dtype {info.dtype}, expected {dtype}", file=info.file, tensor=name,
                                  fix="the checkpoint does not match its quantization config")
        if shape is not None and info.shape != shape:
            raise CheckpointError(f"{what} has shape {list(info.shape)}, expected {list(shape)}", file=info.file,
                                  tensor=name, fix="the checkpoint is damaged or belongs to another model")
        return info

    def _validate_nvfp4(self, module: str, names: dict[str, str]) -> None:
        packed_name = f"{module}.{names['packed']}"
        packed = self._expect(packed_name, "U8", None, "packed FP4 weight")
        if len(packed.shape) != 2:
            raise CheckpointError(f"packed FP4 weight has {len(packed.shape)} dimensions, expected 2",
                                  file=packed.file, tensor=packed_name, fix="the checkpoint is damaged")
        rows, cols = packed.shape[0], packed.shape[1] * 2
        if cols % BLOCK_SIZE:
            raise CheckpointError(f"input dimension K={cols} is not a multiple of {BLOCK_SIZE}", file=packed.file,
                                  tensor=packed_name, fix="NVFP4 needs K divisible by 16; re-quantize this layer or "
                                  "exclude it from quantization")
        self._expect(f"{module}.{names['block_scale']}", "F8_E4M3", (rows, cols // BLOCK_SIZE), "block scale")
        block_scale = self.load(f"{module}.{names['block_scale']}").view(torch.uint8)
        is_nan = (block_scale & 0x7F) == 0x7F
        is_negative = ((block_scale & 0x80) != 0) & (block_scale != 0x80)  # -0 is harmless
        bad = is_nan | is_negative
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            kind = "NaN" if (int(block_scale[row, col]) & 0x7F) == 0x7F else "negative"
            raise CheckpointError(f"block scale [{row}, {col}] is {kind}",
                                  file=self.tensors[f"{module}.{names['block_scale']}"].file,
                                  tensor=f"{module}.{names['block_scale']}",
                                  fix="the checkpoint is damaged; re-quantize or download it again")
        self._validate_positive_scalar(f"{module}.{names['global_scale']}", "global scale")

    def _validate_fp8(self, module: str, names: dict[str, str]) -> None:
        weight = self._expect(f"{module}.{names['weight']}", "F8_E4M3", None, "FP8 weight")
        scale_name = f"{module}.{names['scale']}"
        scale = self._expect(scale_name, "F32", None, "FP8 weight scale")
        if math.prod(scale.shape) not in (1, weight.shape[0]):
            raise CheckpointError(f"FP8 weight scale has shape {list(scale.shape)}; expected one value or one per "
                                  f"output row ({weight.shape[0]})", file=scale.file, tensor=scale_name,
                                  fix="only per-tensor and per-channel FP8 weights are supported")
        values = self.load(scale_name)
        if not (torch.isfinite(values).all() and (values > 0).all()):
            raise CheckpointError("FP8 weight scale is NaN, Inf, zero or negative", file=scale.file,
                                  tensor=scale_name, fix="the checkpoint is damaged; re-quantize this layer")

    def _validate_positive_scalar(self, name: str, what: str) -> None:
        info = self._expect(name, "F32", None, what)
        if math.prod(info.shape) != 1:
            raise CheckpointError(f"{what} has shape {list(info.shape)}, expected a single value", file=info.file,
                                  tensor=name, fix="the checkpoint does not match its quantization config")
        value = float(self.load(name).reshape(()))
        if not math.isfinite(value) or value <= 0:
            raise CheckpointError(f"{what} is {value}; it must be finite and positive", file=info.file, tensor=name,
                                  fix="the layer was quantized from bad data; re-quantize it")


# safetensors dtype → bytes per element
_DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_DOWNLOAD_AGAIN = "the file is damaged or truncated; download it again"


def _read_safetensors_header(path: Path) -> dict:
    """Header of a safetensors file, checked as strictly as the safetensors loader will (every entry well formed,
    sizes matching shapes, data sections back to back covering the file), so damage is caught before loading."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if header_size <= 0 or 8 + header_size > size:
                raise ValueError(f"header length {header_size} does not fit in a {size}-byte file")
            header = json.loads(handle.read(header_size))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"is not a readable safetensors file ({error})", file=path,
                              fix=_DOWNLOAD_AGAIN) from error
    entries = []
    for name, entry in header.items():
        if name != "__metadata__":
            entries.append((_header_entry(path, name, entry), name))
    data_size, position = size - 8 - header_size, 0
    for (begin, end), name in sorted(entries):
        if end > data_size:  # blame the tensor where the file ends, not whichever the header lists last
            raise CheckpointError(f"the file is truncated: the tensor needs bytes up to {end} of a {data_size}-byte "
                                  "data section", file=path, tensor=name, fix="download the file again")
        if begin != position:
            raise CheckpointError(f"the header's data offsets are inconsistent (tensor starts at byte {begin}, "
                                  f"expected {position})", file=path, tensor=name, fix=_DOWNLOAD_AGAIN)
        position = end
    if position != data_size:
        raise CheckpointError(f"the header describes {position} data bytes but the file holds {data_size}", file=path,
                              fix=_DOWNLOAD_AGAIN)
    return header


def _header_entry(path: Path, name: str, entry) -> tuple[int, int]:
    """(begin, end) of one well-formed header entry whose byte size matches its dtype and shape."""
    problem = None
    if not isinstance(entry, dict):
        problem = "its header entry is not an object"
    elif entry.get("dtype") not in _DTYPE_SIZES:
        problem = f"unknown dtype {entry.get('dtype')!r} in the header"
    elif not (isinstance(entry.get("shape"), list)
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"])):
        problem = f"malformed shape {entry.get('shape')!r} in the header"
    elif not (isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["data_offsets"])):
        problem = f"malformed data_offsets {entry.get('data_offsets')!r} in the header"
    else:
        begin, end = entry["data_offsets"]
        expected = math.prod(entry["shape"]) * _DTYPE_SIZES[entry["dtype"]]
        if end - begin != expected:
            problem = (f"the header gives {end - begin} bytes for a {entry['dtype']} tensor of shape {entry['shape']} "
                       f"({expected} bytes)")
        else:
            return begin, end
    raise CheckpointError(problem, file=path, tensor=name, fix=_DOWNLOAD_AGAIN)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class ModelCheck:
    """One checkpoint against its ModelSpec: headers only (names, dtypes, shapes); scale values are the module
    checks' business."""

    def __init__(self, checkpoint: Checkpoint, spec: ModelSpec, modules: dict[str, LayerScheme]):
        self.checkpoint, self.spec, self.modules = checkpoint, spec, modules
        self.model = f"{spec.architecture} ({checkpoint.model_dir / 'config.json'})"

    def run(self) -> None:
        for module, shape in self.spec.linears.items():
            self._check_linear(module, shape)
        for name, shape in self.spec.tensors.items():
            self._check_plain(name, shape)
        for pattern in sorted(self.spec.required_loose):
            if not any(re.match(pattern, name) for name in self.checkpoint.tensors):
                raise CheckpointError(f"missing {self.spec.loose[pattern]}, which {self.model} has",
                                      file=self.checkpoint.listing_file(),
                                      fix="the checkpoint is incomplete; download it again")
        for name in sorted(self.checkpoint.tensors):
            self._check_expected(name)

    def _missing(self, name: str, what: str) -> CheckpointError:
        return CheckpointError(f"missing tensor: {self.model} needs {what}", file=self.checkpoint.listing_file(),
                               tensor=name, fix="the checkpoint is incomplete or config.json belongs to another model")

    def _check_linear(self, module: str, shape: tuple[int, int]) -> None:
        checkpoint, scheme = self.checkpoint, self.modules.get(module)
        if scheme is None:
            if module in self.spec.optional and not any(n.startswith(module + ".") for n in checkpoint.tensors):
                return
            expected = checkpoint.format.scheme_for(module)
            raise self._missing(checkpoint._name(module, expected, expected.tensor_roles[0]),
                                f"the linear layer '{module}' ({shape[0]}×{shape[1]})")
        rows, cols = shape
        role, stored = {NVFP4: ("packed", (rows, cols // 2)), FP8: ("weight", (rows, cols)),
                        UNQUANTIZED: ("weight", (rows, cols))}[scheme.kind]
        name = checkpoint._name(module, scheme, role)
        info = checkpoint.tensors.get(name)
        if scheme.kind == UNQUANTIZED and info is not None and info.dtype not in _FLOAT_DTYPES:
            return  # quantized data where the config says 16 bits: the module check names that mismatch
        if info is not None and info.shape != stored:
            raise CheckpointError(f"has shape {list(info.shape)}, expected {list(stored)}: {self.model} makes "
                                  f"'{module}' {rows}×{cols}" + (" (two FP4 values per byte)" if scheme.kind == NVFP4
                                                                 else ""), file=info.file, tensor=name,
                                  fix="the checkpoint is damaged or config.json belongs to another model")
        bias = checkpoint.tensors.get(f"{module}.bias")
        if bias is not None and (not self.spec.biases or bias.shape != (rows,)):
            raise CheckpointError(f"unexpected bias of shape {list(bias.shape)}: {self.model} gives '{module}' "
                                  + (f"a bias of shape [{rows}]" if self.spec.biases else "no bias"), file=bias.file,
                                  tensor=f"{module}.bias", fix="config.json belongs to another model")

    def _check_plain(self, name: str, shape: tuple[int, ...]) -> None:
        info = self.checkpoint.tensors.get(name)
        if info is None:
            if name in self.spec.optional:
                return
            raise self._missing(name, f"'{name}' of shape {list(shape)}")
        if info.dtype not in _FLOAT_DTYPES:
            raise CheckpointError(f"has dtype {info.dtype}, expected a 16- or 32-bit float "
                                  f"({', '.join(_FLOAT_DTYPES)})",
                                  file=info.file, tensor=name, fix="the checkpoint is damaged; download it again")
        if info.shape != shape:
            raise CheckpointError(f"has shape {list(info.shape)}, expected {list(shape)} ({self.model})",
                                  file=info.file, tensor=name,
                                  fix="the checkpoint is damaged or config.json belongs to another model")

    def _check_expected(self, name: str) -> None:
        """Every tensor belongs to something the model has."""
        info = self.checkpoint.tensors[name]
        module = name.rpartition(".")[0]
        if name in self.spec.tensors or module in self.spec.linears:
            return  # a linear's own tensors are held to its quantization scheme by the module checks
        loose = self.spec.loose_part(name)
        if loose is not None:
            if info.dtype not in _FLOAT_DTYPES:
                raise CheckpointError(f"has dtype {info.dtype}; {self.spec.loose[loose]} is served unquantized and "
                                      f"must be stored as {', '.join(_FLOAT_DTYPES)}", file=info.file, tensor=name,
                                      fix="exclude it from quantization when exporting")
            return
        layer = _LAYER_INDEX.search(name)
        if layer is not None and int(layer.group(1)) >= self.spec.layers:
            problem = f"unexpected tensor: {self.model} has {self.spec.layers} layers (num_hidden_layers)"
        else:
            problem = f"unexpected tensor: {self.model} has no such tensor"
        raise CheckpointError(problem, file=info.file, tensor=name,
                              fix="config.json belongs to another model, or the checkpoint was assembled wrongly")
