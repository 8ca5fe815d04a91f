"""GPU memory plan for serving an NVFP4 model with vLLM + volta_nvfp4: does it fit, and with which flags.

Budget per GPU, in the order vLLM spends ``--gpu-memory-utilization × total``:
  weights (NVFP4 at 4.5 bits, FP8, fp16 excluded layers, embeddings, small tensors) → activations of one prefill
  chunk → the plugin's dequantize scratch → CUDA-graph pool → memory outside torch's allocator → what is left is the
  KV cache. The KV cache costs bytes per token on full-attention layers only; linear-attention (Gated-DeltaNet)
  layers of hybrid models keep a fixed recurrent state per running sequence instead.

Weights come from checkpoint headers when the directory has safetensors (exact bytes), otherwise they are estimated
from config.json shapes (and the config's quantization section, when it has one). No vLLM import.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from vllm_volta_fp4.format.architecture import ConfigFieldError, vision_tensor_shapes
from vllm_volta_fp4.format.checkpoint import (
    FP8,
    NVFP4,
    UNQUANTIZED,
    Checkpoint,
    CheckpointError,
    QuantFormat,
    parse_quant_config,
)
from vllm_volta_fp4.format.nvfp4 import BLOCK_SIZE

GIB = 1 << 30
MIB = 1 << 20
FP16_BYTES = 2

# Total memory as nvidia-smi / torch.cuda.mem_get_info report it (vLLM's utilisation is a fraction of this).
GPU_PRESETS = {"v100-32gb": 32510 * MIB, "v100-16gb": 16160 * MIB}

# Fixed allowances, not computable from the model:
CUDA_GRAPH_POOL_BYTES = 1 * GIB  # graphs for every captured batch size up to max-num-seqs; gone with --enforce-eager
NON_TORCH_BYTES = GIB // 2  # cuBLAS workspaces and CUDA context growth that torch's allocator does not see
GDN_CHUNK = 64  # tokens per chunk of vLLM's chunked gated-delta-rule prefill (one fp32 state kept per chunk)
UTILIZATION_STEPS = (0.90, 0.92, 0.95)  # tried in order; above 0.95 the CUDA context itself no longer fits
DEFAULT_BATCHED_TOKENS = 2048  # prefill chunk: ~2 s of V100 prefill, so decode steps of others wait at most that
MAX_SUGGESTED_SEQS = 256

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "U8": 1, "I8": 1, "I32": 4,
                "I64": 8, "BOOL": 1}
_TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}

# Checkpoint projections that vLLM fuses into one layer (the plugin dequantizes a whole fused layer at once).
_FUSED_INTO = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
               "up_proj": "gate_up_proj", "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz",
               "in_proj_b": "in_proj_ba", "in_proj_a": "in_proj_ba"}


class PlanError(ValueError):
    """Input the planner cannot use, with what to do about it."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    total_bytes: int


def parse_gpu(text: str) -> GpuSpec:
    """'v100-32gb', 'v100-16gb' or a size in GiB ('24', '31.5')."""
    key = text.strip().lower()
    if key in GPU_PRESETS:
        return GpuSpec(key, GPU_PRESETS[key])
    try:
        gib = float(key.removesuffix("gib"))
    except ValueError:
        raise PlanError(f"--gpu {text!r}: expected {', '.join(GPU_PRESETS)} or a memory size in GiB") from None
    if not 0 < gib < 4096:
        raise PlanError(f"--gpu {text!r}: the memory size must be a positive number of GiB")
    return GpuSpec(f"{gib:g} GiB GPU", int(gib * GIB))


@dataclass(frozen=True)
class GatedDeltaNetShape:
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:  # q, k and v go through the short convolution
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from config.json (the text model's part of it)."""

    name: str
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    attn_output_gate: bool
    layer_kinds: tuple[str, ...]  # "full" or "linear" per layer
    tie_word_embeddings: bool
    qk_norm: bool
    gdn: GatedDeltaNetShape | None
    ssm_state_bytes: int  # per element of the recurrent state (config's mamba_ssm_dtype, else fp16)
    layer_prefix: str
    quant_config: dict | None
    mtp_layers: int = 0  # mtp_num_hidden_layers: the MTP module's full-attention layers (loaded only to speculate)
    vision_params: int = 0  # the vision tower's parameters (Qwen3.5/3.8: vision_config), served in fp16

    @property
    def full_attention_layers(self) -> int:
        return self.layer_kinds.count("full")

    @property
    def linear_attention_layers(self) -> int:
        return self.layer_kinds.count("linear")


def read_config(path: str | Path) -> tuple[dict, Path]:
    """config.json of a model directory, or a config file itself."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise PlanError(f"{file}: not found; pass a model directory or its config.json")
    try:
        return json.loads(file.read_text()), file
    except (OSError, json.JSONDecodeError) as error:
        raise PlanError(f"{file}: cannot be read as JSON ({error})") from error


def _layer_kinds(text: dict, layers: int, where: Path) -> tuple[str, ...]:
    if "layer_types" in text:
        kinds = []
        for index, kind in enumerate(text["layer_types"]):
            if kind == "linear_attention":
                kinds.append("linear")
            elif kind in ("full_attention", "attention", "sliding_attention"):
                # sliding-window layers are counted as full: an upper bound for their KV cache
                kinds.append("full")
            else:
                raise PlanError(f"{where}: layer_types[{index}] is {kind!r}; the planner knows full_attention, "
                                "sliding_attention and linear_attention layers")
        if len(kinds) != layers:
            raise PlanError(f"{where}: layer_types lists {len(kinds)} layers but num_hidden_layers is {layers}")
        return tuple(kinds)
    interval = text.get("full_attention_interval")
    if interval:
        return tuple("full" if (index + 1) % interval == 0 else "linear" for index in range(layers))
    return ("full",) * layers


def model_shape(config: dict, where: Path) -> ModelShape:
    """The text model's shape from a Hugging Face config (nested under text_config for multimodal wrappers)."""
    text = config.get("text_config") or config

    def need(key: str) -> int:
        if key not in text:
            place = "text_config" if text is not config else "the top level"
            raise PlanError(f"{where}: no {key!r} (looked in {place}); is this a decoder-only language model's "
                            "config.json?")
        return int(text[key])

    if text.get("num_experts") or text.get("num_local_experts"):
        raise PlanError(f"{where}: mixture-of-experts models are not served by volta_nvfp4 yet, so there is nothing "
                        "to plan")
    hidden, layers, heads = need("hidden_size"), need("num_hidden_layers"), need("num_attention_heads")
    kinds = _layer_kinds(text, layers, where)
    gdn = None
    if "linear" in kinds:
        gdn = GatedDeltaNetShape(need("linear_num_key_heads"), need("linear_num_value_heads"),
                                 need("linear_key_head_dim"), need("linear_value_head_dim"),
                                 need("linear_conv_kernel_dim"))
    ssm_dtype = str(text.get("mamba_ssm_dtype") or "float16")
    if ssm_dtype not in _TORCH_DTYPE_BYTES:
        raise PlanError(f"{where}: mamba_ssm_dtype {ssm_dtype!r} is not one of {', '.join(_TORCH_DTYPE_BYTES)}")
    tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    architecture = (config.get("architectures") or [config.get("model_type", "model")])[0]
    return ModelShape(
        name=architecture, hidden=hidden, intermediate=need("intermediate_size"), vocab=need("vocab_size"),
        heads=heads, kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or hidden // heads), attn_output_gate=bool(text.get("attn_output_gate")),
        layer_kinds=kinds, tie_word_embeddings=bool(tie), qk_norm=text.get("model_type", "").startswith("qwen3"),
        gdn=gdn, ssm_state_bytes=_TORCH_DTYPE_BYTES[ssm_dtype],
        layer_prefix="model.language_model.layers" if "text_config" in config else "model.layers",
        quant_config=config.get("quantization_config"), mtp_layers=int(text.get("mtp_num_hidden_layers") or 0),
        vision_params=_vision_params(config, hidden, where))


def _vision_params(config: dict, hidden: int, where: Path) -> int:
    """Parameters of the vision tower config.json describes (the tensors vLLM's model code loads), 0 without one."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    try:
        return sum(math.prod(shape) for shape in vision_tensor_shapes(vision, hidden).values())
    except ConfigFieldError as error:
        raise PlanError(f"{where}: vision_config: {error}") from None


@dataclass
class WeightBytes:
    """Bytes of the served weights by storage kind (float tensors counted at fp16: a V100 serves in half)."""

    nvfp4: int = 0
    fp8: int = 0
    fp16_linear: int = 0
    embeddings: int = 0
    other: int = 0  # norms, convolution and gate parameters, biases, scales of nothing
    vision: int = 0  # the vision tower (fp16); vLLM loads it unless --language-model-only
    nvfp4_params: int = 0
    fp8_params: int = 0
    fp16_linear_params: int = 0
    fp16_linear_modules: list[str] = field(default_factory=list)
    largest_fused_params: int = 0  # the largest layer vLLM builds from quantized shards
    exact: bool = False
    source: str = ""

    @property
    def total(self) -> int:
        return self.nvfp4 + self.fp8 + self.fp16_linear + self.embeddings + self.other + self.vision


def _stored_bytes(kind: str, rows: int, cols: int) -> int:
    """Bytes of one [rows, cols] weight stored as ``kind`` (NVFP4: 4-bit codes + an E4M3 scale per 16 + fp32)."""
    if kind == NVFP4:
        return rows * cols // 2 + rows * cols // BLOCK_SIZE + 4
    if kind == FP8:
        return rows * cols + 4
    return rows * cols * FP16_BYTES


def _fused_name(module: str) -> str:
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{_FUSED_INTO.get(leaf, leaf)}"


def _add_linear(weights: WeightBytes, fused_params: dict[str, int], module: str, kind: str, params: int,
                stored: int) -> None:
    if "embed" in module:
        weights.embeddings += stored
    elif kind == NVFP4:
        weights.nvfp4 += stored
        weights.nvfp4_params += params
    elif kind == FP8:
        weights.fp8 += stored
        weights.fp8_params += params
    else:
        weights.fp16_linear += stored
        weights.fp16_linear_params += params
        weights.fp16_linear_modules.append(module)
    if kind != UNQUANTIZED:
        fused = _fused_name(module)
        fused_params[fused] = fused_params.get(fused, 0) + params


def weights_from_checkpoint(model_dir: str | Path) -> WeightBytes:
    """Exact bytes from the safetensors headers of a quantized checkpoint."""
    checkpoint = Checkpoint(model_dir)
    modules = checkpoint.linear_modules()
    weights = WeightBytes(exact=True, source="checkpoint headers")
    fused_params: dict[str, int] = {}
    per_module: dict[str, int] = {}
    for name, info in checkpoint.tensors.items():
        if name.startswith(MTP_PREFIX):  # loaded only with speculative decoding: see mtp_cost
            continue
        module = name.rpartition(".")[0]
        count = math.prod(info.shape)
        dtype_bytes = _DTYPE_BYTES.get(info.dtype)
        if dtype_bytes is None:
            raise CheckpointError(f"tensor dtype {info.dtype} is unknown to the planner", file=info.file, tensor=name)
        is_float = info.dtype in ("F32", "F16", "BF16", "F64")
        scheme = modules.get(module)
        # quantized tensors stay as stored; float tensors are served in fp16, except the small fp32 scales of
        # quantized layers
        stored = count * (dtype_bytes if (not is_float or (scheme and scheme.kind != UNQUANTIZED)) else FP16_BYTES)
        if name.startswith(VISION_PREFIX):
            weights.vision += stored
        elif scheme is None:
            weights.other += stored
        else:
            per_module[module] = per_module.get(module, 0) + stored
    for module, stored in per_module.items():
        kind = modules[module].kind
        weight = checkpoint.tensors.get(f"{module}.weight") or checkpoint.tensors.get(f"{module}.weight_packed")
        rows, cols = weight.shape[0], weight.shape[1] * (2 if weight.dtype == "U8" else 1)
        _add_linear(weights, fused_params, module, kind, rows * cols, stored)
    weights.largest_fused_params = max(fused_params.values(), default=0)
    return weights


def _attention_shapes(shape: ModelShape, prefix: str) -> list[tuple[str, int, int]]:
    q_rows = shape.heads * shape.head_dim * (2 if shape.attn_output_gate else 1)  # the gate rides on q_proj
    kv_rows = shape.kv_heads * shape.head_dim
    return [(f"{prefix}.self_attn.q_proj", q_rows, shape.hidden), (f"{prefix}.self_attn.k_proj", kv_rows, shape.hidden),
            (f"{prefix}.self_attn.v_proj", kv_rows, shape.hidden),
            (f"{prefix}.self_attn.o_proj", shape.hidden, shape.heads * shape.head_dim)]


def linear_shapes(shape: ModelShape) -> list[tuple[str, int, int]]:
    """(module, rows, cols) of every weight matrix of the model, named as Hugging Face checkpoints name them."""
    h, i = shape.hidden, shape.intermediate
    matrices = [("model.embed_tokens", shape.vocab, h)]
    for index, kind in enumerate(shape.layer_kinds):
        prefix = f"{shape.layer_prefix}.{index}"
        if kind == "full":
            matrices += _attention_shapes(shape, prefix)
        else:
            gdn = shape.gdn
            matrices += [(f"{prefix}.linear_attn.in_proj_qkv", gdn.conv_dim, h),
                         (f"{prefix}.linear_attn.in_proj_z", gdn.value_dim, h),
                         (f"{prefix}.linear_attn.in_proj_b", gdn.num_value_heads, h),
                         (f"{prefix}.linear_attn.in_proj_a", gdn.num_value_heads, h),
                         (f"{prefix}.linear_attn.out_proj", h, gdn.value_dim)]
        matrices += [(f"{prefix}.mlp.gate_proj", i, h), (f"{prefix}.mlp.up_proj", i, h),
                     (f"{prefix}.mlp.down_proj", h, i)]
    if not shape.tie_word_embeddings:
        matrices.append(("lm_head", shape.vocab, h))
    return matrices


def _small_tensor_params(shape: ModelShape) -> int:
    """Norms and GDN convolution/decay parameters: not matrices, kept in fp16."""
    per_layer = 2 * shape.hidden  # input and post-attention norms
    total = shape.hidden  # final norm
    for kind in shape.layer_kinds:
        total += per_layer
        if kind == "full":
            total += 2 * shape.head_dim if shape.qk_norm else 0
        else:
            gdn = shape.gdn
            total += gdn.conv_dim * gdn.conv_kernel + 2 * gdn.num_value_heads + gdn.value_head_dim
    return total


def weights_from_config(shape: ModelShape) -> WeightBytes:
    """Estimated bytes from shapes. The config's quantization section decides each matrix's storage; without one,
    every decoder-layer matrix is taken as NVFP4 and lm_head / embeddings as fp16 (how NVFP4 checkpoints ship)."""
    quant: QuantFormat | None = parse_quant_config(shape.quant_config) if shape.quant_config else None
    weights = WeightBytes(exact=False, source="estimated from config.json shapes"
                          + ("" if quant else "; no quantization_config, so decoder layers are taken as NVFP4"))
    fused_params: dict[str, int] = {}
    for module, rows, cols in linear_shapes(shape):
        if "embed" in module or module == "lm_head":
            kind = quant.scheme_for(module).kind if quant and module == "lm_head" else UNQUANTIZED
        elif quant and quant.is_excluded(_fused_name(module)):  # exclusions may name vLLM's fused layer
            kind = UNQUANTIZED
        else:
            kind = quant.scheme_for(module).kind if quant else NVFP4
        _add_linear(weights, fused_params, module, kind, rows * cols, _stored_bytes(kind, rows, cols))
    weights.other = _small_tensor_params(shape) * FP16_BYTES
    weights.vision = shape.vision_params * FP16_BYTES
    weights.largest_fused_params = max(fused_params.values(), default=0)
    return weights


MTP_PREFIX = "mtp."
VISION_PREFIX = "model.visual."


def mtp_linear_shapes(shape: ModelShape) -> list[tuple[str, int, int]]:
    """(module, rows, cols) of the MTP module's matrices, as Qwen3.5 checkpoints name them: fc [h, 2h] and full-
    attention decoder layers (embedding and lm_head are the main model's)."""
    h, i = shape.hidden, shape.intermediate
    matrices = [("mtp.fc", h, 2 * h)]
    for index in range(shape.mtp_layers):
        prefix = f"mtp.layers.{index}"
        matrices += _attention_shapes(shape, prefix) + [(f"{prefix}.mlp.gate_proj", i, h),
                                                         (f"{prefix}.mlp.up_proj", i, h),
                                                         (f"{prefix}.mlp.down_proj", h, i)]
    return matrices


@dataclass(frozen=True)
class MtpCost:
    """What speculative decoding with the checkpoint's MTP module adds: its weights as served (the layers the
    checkpoint left 16-bit quantized to the drafter's format: plugin/models/draft_weights.py), the quantized copy of
    lm_head its drafts score the vocabulary with (0 when VLLM_VOLTA_FP4_DRAFT_WEIGHTS is off) and its layers' KV
    cache."""

    weights: WeightBytes
    kv_bytes_per_token: int  # per GPU
    draft_head_bytes: int = 0  # all GPUs together (split by vocabulary rows like lm_head)

    @property
    def weight_bytes(self) -> int:
        return self.weights.total + self.draft_head_bytes


def drafter_stored_bytes(draft_format: str, rows: int, cols: int) -> int:
    """Bytes of a [rows, cols] 16-bit weight the drafter quantizes to ``draft_format`` (FP8 or NVFP4): the stored
    weight and one float32 scale per row."""
    return _stored_bytes(draft_format, rows, cols) + 4 * rows


def draft_head_bytes(shape: ModelShape, draft_format: str | None) -> int:
    """Bytes of the drafts' lm_head copy in ``draft_format`` (``FP8``, ``NVFP4`` or None: no copy), all GPUs."""
    return drafter_stored_bytes(draft_format, shape.vocab, shape.hidden) if draft_format else 0


def mtp_cost(shape: ModelShape, tensor_parallel: int = 1, draft_format: str | None = FP8) -> MtpCost | None:
    """None for a model without an MTP module. Matrices are stored as the config's quantization section says
    (real exports exclude "*mtp*": 16-bit), 16-bit without one; the fc is always 16-bit (ModelOpt keeps it so).
    ``draft_format``: what the drafter quantizes its 16-bit matrices and its lm_head copy to (None: nothing)."""
    if not shape.mtp_layers:
        return None
    quant = parse_quant_config(shape.quant_config) if shape.quant_config else None
    weights = WeightBytes(source="estimated from config.json shapes")
    for module, rows, cols in mtp_linear_shapes(shape):
        kind = UNQUANTIZED
        if quant and module != "mtp.fc" and not quant.is_excluded(_fused_name(module)):
            kind = quant.scheme_for(module).kind
        stored = _stored_bytes(kind, rows, cols)
        if kind == UNQUANTIZED and draft_format:  # the drafter quantizes what the checkpoint left 16-bit
            kind, stored = draft_format, drafter_stored_bytes(draft_format, rows, cols)
        _add_linear(weights, {}, module, kind, rows * cols, stored)
    norms = 3 * shape.hidden + shape.mtp_layers * (2 * shape.hidden + (2 * shape.head_dim if shape.qk_norm else 0))
    weights.other = norms * FP16_BYTES
    kv_heads_per_gpu = max(1, shape.kv_heads // tensor_parallel)
    return MtpCost(weights, shape.mtp_layers * 2 * kv_heads_per_gpu * shape.head_dim * FP16_BYTES,
                   draft_head_bytes(shape, draft_format))


@dataclass(frozen=True)
class ServeRequest:
    gpu: GpuSpec
    max_model_len: int
    max_num_seqs: int | None = None
    tensor_parallel: int = 1
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    speculative_tokens: int = 0  # MTP speculative decoding with this many draft tokens (0: off)
    draft_format: str | None = FP8  # the MTP drafter's weights: FP8, NVFP4 or None (VLLM_VOLTA_FP4_DRAFT_WEIGHTS)
    language_model_only: bool = False  # vLLM's --language-model-only: the vision tower is not loaded

    def __post_init__(self):
        for name in ("max_model_len", "tensor_parallel"):
            if getattr(self, name) < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise PlanError("--max-num-seqs must be at least 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise PlanError("--max-num-batched-tokens must be at least 1")
        if self.speculative_tokens < 0:
            raise PlanError("--speculative-tokens must be 0 (off) or more")


@dataclass
class MemoryPlan:
    shape: ModelShape
    weights: WeightBytes
    request: ServeRequest
    weights_per_gpu: int
    kv_bytes_per_token: int  # per GPU, full-attention layers only
    state_bytes_per_sequence: int  # per GPU, linear-attention layers' conv + recurrent state
    activation_bytes: int
    dequant_scratch_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int
    batched_tokens: int
    gpu_memory_utilization: float
    kv_space_bytes: int
    max_num_seqs: int
    longest_fitting_len: int  # the longest max-model-len that fits at the highest utilisation tried
    mtp: MtpCost | None = None  # the MTP module's cost (counted in the plan only with speculative_tokens)

    @property
    def fixed_bytes(self) -> int:
        return (self.weights_per_gpu + self.activation_bytes + self.dequant_scratch_bytes + self.cuda_graph_bytes
                + self.non_torch_bytes)

    @property
    def bytes_per_full_sequence(self) -> int:
        return self.kv_bytes_per_token * self.request.max_model_len + self.state_bytes_per_sequence

    @property
    def full_length_sequences(self) -> int:
        """Sequences of max-model-len that the KV cache holds at once."""
        return max(0, self.kv_space_bytes) // self.bytes_per_full_sequence

    @property
    def fits(self) -> bool:  # vLLM refuses to start unless one sequence of max-model-len fits
        return self.full_length_sequences >= 1

    def vllm_flags(self) -> list[str]:
        flags = ["--quantization", "volta_nvfp4", "--dtype", "half",
                 "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}",
                 "--max-model-len", str(self.request.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
                 "--enable-chunked-prefill", "--max-num-batched-tokens", str(self.batched_tokens)]
        if self.request.tensor_parallel > 1:
            flags += ["--tensor-parallel-size", str(self.request.tensor_parallel)]
        if self.request.language_model_only:
            flags.append("--language-model-only")
        if self.request.enforce_eager:
            flags.append("--enforce-eager")
        if self.request.speculative_tokens:
            flags += ["--speculative-config",
                      json.dumps({"method": "mtp", "num_speculative_tokens": self.request.speculative_tokens})]
        return flags


def kv_bytes_per_token(shape: ModelShape, tensor_parallel: int) -> int:
    """fp16 K and V of every full-attention layer; KV heads are replicated when fewer than the TP size."""
    kv_heads_per_gpu = max(1, shape.kv_heads // tensor_parallel)
    return shape.full_attention_layers * 2 * kv_heads_per_gpu * shape.head_dim * FP16_BYTES


def state_bytes_per_sequence(shape: ModelShape, tensor_parallel: int) -> int:
    """Gated-DeltaNet layers: a conv state (kernel-1 steps of q, k, v) and a recurrent state per value head."""
    if shape.gdn is None:
        return 0
    gdn = shape.gdn
    conv = gdn.conv_dim // tensor_parallel * (gdn.conv_kernel - 1) * FP16_BYTES
    recurrent = gdn.num_value_heads // tensor_parallel * gdn.key_head_dim * gdn.value_head_dim * shape.ssm_state_bytes
    return shape.linear_attention_layers * (conv + recurrent)


def activation_bytes(shape: ModelShape, batched_tokens: int, max_num_seqs: int, tensor_parallel: int) -> int:
    """Peak of one forward of ``batched_tokens`` tokens (what vLLM's profiling run sees): fp16 residual, normed
    input, attention and MLP outputs (4 × hidden) plus gate_up (2 × intermediate) and its activation (1 ×),
    the fp32 per-chunk states of the chunked GDN prefill, and fp32 logits + probabilities for every sequence."""
    per_token = FP16_BYTES * (4 * shape.hidden + 3 * shape.intermediate // tensor_parallel)
    gdn_chunks = 0
    if shape.gdn is not None:
        gdn = shape.gdn
        gdn_chunks = (math.ceil(batched_tokens / GDN_CHUNK) * gdn.num_value_heads // tensor_parallel
                      * gdn.key_head_dim * gdn.value_head_dim * 4)
    logits = 2 * max_num_seqs * shape.vocab * 4
    return batched_tokens * per_token + gdn_chunks + logits


def check_tensor_parallel(shape: ModelShape, tp: int) -> None:
    """The shards vLLM builds at this tensor-parallel size: heads, MLP and Gated-DeltaNet heads split evenly, KV
    heads split or replicated, and every row-parallel layer's input in whole 16-element NVFP4 blocks."""
    problems = []
    if shape.heads % tp:
        problems.append(f"{shape.heads} attention heads")
    if shape.kv_heads % tp and tp % shape.kv_heads:
        problems.append(f"{shape.kv_heads} KV heads (vLLM splits them or replicates them a whole number of times)")
    if shape.intermediate % tp or (shape.intermediate // tp) % BLOCK_SIZE:
        problems.append(f"intermediate size {shape.intermediate} (each GPU's share of down_proj's input must be a "
                        f"multiple of {BLOCK_SIZE}, NVFP4's block)")
    if shape.gdn and (shape.gdn.num_key_heads % tp or shape.gdn.num_value_heads % tp):
        problems.append(f"{shape.gdn.num_key_heads} / {shape.gdn.num_value_heads} Gated-DeltaNet key / value heads")
    if problems:
        raise PlanError(f"--tp {tp} does not divide {shape.name}'s " + "; ".join(problems) + ": choose a "
                        "tensor-parallel size that divides them all")


def plan_memory(shape: ModelShape, weights: WeightBytes, request: ServeRequest) -> MemoryPlan:
    tp = request.tensor_parallel
    mtp = mtp_cost(shape, tp, request.draft_format)
    if request.speculative_tokens and mtp is None:
        raise PlanError(f"{shape.name} has no MTP module (no mtp_num_hidden_layers in its config), so there is "
                        "nothing to speculate with; drop --speculative-tokens")
    speculating = bool(request.speculative_tokens)
    check_tensor_parallel(shape, tp)
    # Embeddings, lm_head, linear layers and the vision tower are split across GPUs; norms and the like are
    # replicated.
    served = weights.total - (weights.vision if request.language_model_only else 0)
    weights_per_gpu = (served - weights.other) // tp + weights.other
    if speculating:
        weights_per_gpu += (mtp.weights.total - mtp.weights.other + mtp.draft_head_bytes) // tp + mtp.weights.other
    kv_token = kv_bytes_per_token(shape, tp) + (mtp.kv_bytes_per_token if speculating else 0)
    state_seq = state_bytes_per_sequence(shape, tp)
    scratch = weights.largest_fused_params // tp * FP16_BYTES  # dequantize + cuBLAS path of large batches
    graphs = 0 if request.enforce_eager else CUDA_GRAPH_POOL_BYTES
    per_sequence = kv_token * request.max_model_len + state_seq

    def kv_space(utilization: float, seqs: int, batched_tokens: int) -> int:
        fixed = (weights_per_gpu + activation_bytes(shape, batched_tokens, seqs, tp) + scratch + graphs
                 + NON_TORCH_BYTES)
        return int(request.gpu.total_bytes * utilization) - fixed

    batched = request.max_num_batched_tokens or max(DEFAULT_BATCHED_TOKENS, request.max_num_seqs or 1)
    # Without --max-num-seqs: as many sequences as can all reach max-model-len at once (no preemption ever).
    seqs = request.max_num_seqs or max(1, min(MAX_SUGGESTED_SEQS, kv_space(UTILIZATION_STEPS[0], 1, batched)
                                              // per_sequence))
    utilization = next((u for u in UTILIZATION_STEPS if kv_space(u, seqs, batched) >= per_sequence),
                       UTILIZATION_STEPS[-1])
    space_at_most = kv_space(UTILIZATION_STEPS[-1], seqs, batched)
    longest = max(0, (space_at_most - state_seq) // kv_token) // 1024 * 1024 if kv_token else request.max_model_len
    return MemoryPlan(
        shape=shape, weights=weights, request=request, weights_per_gpu=weights_per_gpu, kv_bytes_per_token=kv_token,
        state_bytes_per_sequence=state_seq, activation_bytes=activation_bytes(shape, batched, seqs, tp),
        dequant_scratch_bytes=scratch, cuda_graph_bytes=graphs, non_torch_bytes=NON_TORCH_BYTES,
        batched_tokens=batched, gpu_memory_utilization=utilization, kv_space_bytes=kv_space(utilization, seqs, batched),
        max_num_seqs=seqs, longest_fitting_len=longest, mtp=mtp)


def plan_for(path: str | Path, request: ServeRequest) -> MemoryPlan:
    """Plan for a model directory (exact weights when it holds safetensors) or a bare config.json."""
    config, config_file = read_config(path)
    shape = model_shape(config, config_file)
    path = Path(path)
    has_tensors = path.is_dir() and any(path.glob("*.safetensors"))
    weights = weights_from_checkpoint(path) if has_tensors else weights_from_config(shape)
    return plan_memory(shape, weights, request)


def _count(params: int) -> str:
    return f"{params / 1e9:6.2f} B" if params >= 1e8 else f"{params / 1e6:6.2f} M"


def _gib(value: int) -> str:
    return f"{value / GIB:8.2f} GiB" if value >= GIB else f"{value / MIB:8.1f} MiB"


def _mtp_lines(plan: MemoryPlan) -> list[str]:
    mtp, tp = plan.mtp, plan.request.tensor_parallel
    if mtp is None:
        return []
    on = plan.request.speculative_tokens
    kinds = ", ".join(sorted({kind for kind, params in (("NVFP4", mtp.weights.nvfp4_params),
                                                        ("FP8", mtp.weights.fp8_params),
                                                        ("fp16", mtp.weights.fp16_linear_params)) if params}))
    head = (f" + {plan.request.draft_format.upper()} lm_head copy for the drafts "
            f"{_gib(mtp.draft_head_bytes // tp).strip()}" if mtp.draft_head_bytes else "")
    return [f"MTP module ({plan.shape.mtp_layers} full-attention layer(s), {kinds}): weights "
            f"{_gib(mtp.weights.total // tp).strip()}{head} + KV cache {mtp.kv_bytes_per_token / 1024:.1f} KiB/token — "
            + (f"counted above (speculating {on} tokens)" if on else "not counted (add --speculative-tokens K "
               "to plan MTP speculative decoding)")]


def format_plan(plan: MemoryPlan) -> str:
    shape, weights, request = plan.shape, plan.weights, plan.request
    tp = request.tensor_parallel
    excluded = sorted({re.sub(r"\.\d+\.", ".N.", module) for module in weights.fp16_linear_modules})
    lines = [
        f"{shape.name}: {len(shape.layer_kinds)} layers ({shape.full_attention_layers} full attention"
        + (f", {shape.linear_attention_layers} Gated-DeltaNet" if shape.linear_attention_layers else "") + ")",
        f"GPU: {request.gpu.name} ({request.gpu.total_bytes / GIB:.2f} GiB), tensor parallel {tp}",
        f"weights ({'exact, ' if weights.exact else ''}{weights.source}), per GPU:",
        f"  NVFP4 linear   {_count(weights.nvfp4_params)} params  {_gib(weights.nvfp4 // tp)}",
        f"  FP8 linear     {_count(weights.fp8_params)} params  {_gib(weights.fp8 // tp)}",
        f"  fp16 linear    {_count(weights.fp16_linear_params)} params  {_gib(weights.fp16_linear // tp)}"
        + (f"  ({', '.join(excluded[:4])}{', …' if len(excluded) > 4 else ''})" if excluded else ""),
        f"  embeddings (fp16)                {_gib(weights.embeddings // tp)}",
        f"  other (norms, conv, scales)      {_gib(weights.other)}",
        *([f"  vision tower (fp16)              {_gib(weights.vision // tp)}"
           + ("  not loaded: --language-model-only" if request.language_model_only
              else "  (text only? --language-model-only leaves it out)")] if weights.vision else []),
        f"  total                            {_gib(plan.weights_per_gpu)}",
        f"activations ({plan.batched_tokens}-token prefill chunk)  {_gib(plan.activation_bytes)}",
        f"dequantize scratch (largest fused layer in fp16)  {_gib(plan.dequant_scratch_bytes)}",
        f"CUDA graphs{' (off: --enforce-eager)' if request.enforce_eager else ''}  {_gib(plan.cuda_graph_bytes)}",
        f"outside torch (cuBLAS workspace, context growth)  {_gib(plan.non_torch_bytes)}",
        f"budget at --gpu-memory-utilization {plan.gpu_memory_utilization:.2f}: "
        f"{_gib(int(request.gpu.total_bytes * plan.gpu_memory_utilization))}, fixed {_gib(plan.fixed_bytes)}",
        f"KV cache: {plan.kv_bytes_per_token / 1024:.1f} KiB/token ({shape.full_attention_layers} full-attention "
        "layers, fp16)" + (f" + {plan.state_bytes_per_sequence / MIB:.1f} MiB recurrent state/sequence "
                            f"({shape.linear_attention_layers} Gated-DeltaNet layers)" if shape.gdn else ""),
        *_mtp_lines(plan),
        f"KV cache space {_gib(max(0, plan.kv_space_bytes))} → {plan.full_length_sequences} sequence(s) of "
        f"{request.max_model_len} tokens at once ({plan.bytes_per_full_sequence / GIB:.2f} GiB each)",
    ]
    if plan.fits:
        lines.append("verdict: FITS")
        if request.max_num_seqs and request.max_num_seqs > plan.full_length_sequences:
            lines.append(f"  note: only {plan.full_length_sequences} of {request.max_num_seqs} sequences can reach "
                         "max-model-len together; vLLM preempts the others when they grow that long")
        lines.append("vLLM flags: " + " ".join(shlex.quote(flag) for flag in plan.vllm_flags()))
    else:
        lines.append(f"verdict: DOES NOT FIT — one {request.max_model_len}-token sequence needs "
                     f"{plan.bytes_per_full_sequence / GIB:.2f} GiB, {max(0, plan.kv_space_bytes) / GIB:.2f} GiB "
                     "are left")
        lines.append(f"  the longest max-model-len that fits is {plan.longest_fitting_len} (at utilisation "
                     f"{UTILIZATION_STEPS[-1]:.2f})" if plan.longest_fitting_len
                     else "  the weights alone do not leave room for a KV cache: use more GPUs (--tp) or a larger GPU")
        if not request.enforce_eager and plan.kv_space_bytes + plan.cuda_graph_bytes >= plan.bytes_per_full_sequence:
            lines.append("  or add --enforce-eager: it frees the CUDA-graph pool (decode gets slower)")
    if not plan.weights.exact:
        lines.append("(weights are an estimate from config.json; pass the model directory for exact bytes)")
    return "\n".join(lines)
