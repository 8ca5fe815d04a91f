"""What the model config.json describes needs from its checkpoint: every tensor's name and logical shape.

``model_spec(config)`` knows Llama, Qwen3 and the Qwen3.5 / Qwen3.8 hybrid (Gated DeltaNet + gated attention, with
its vision tower). Linear layers are given by their logical weight shape (rows, columns); how they are stored
(NVFP4 packed + scales, FP8, 16-bit) is the quantization config's business and is checked in ``checkpoint``.
Architectures not in the table give None: the caller validates what the quantization config alone allows and
says so. No vLLM import here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class ModelSpec:
    """The tensors a checkpoint of one architecture must hold."""

    architecture: str
    layers: int
    linears: dict[str, tuple[int, int]] = field(default_factory=dict)  # module → (output rows, input columns)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every other 16-bit tensor → shape
    optional: set[str] = field(default_factory=set)  # tensor or module names that may be absent (tied lm_head)
    # name regex → what its tensors are; checked only for being 16/32-bit floats (towers and heads whose layout
    # vLLM's model code owns, rotary tables it skips)
    loose: dict[str, str] = field(default_factory=dict)
    required_loose: set[str] = field(default_factory=set)  # loose regexes that must match at least one tensor
    biases: bool = False  # linear layers may carry a bias of their output size

    def loose_part(self, name: str) -> str | None:
        """The loose regex ``name`` falls under, if any."""
        return next((pattern for pattern in self.loose if re.match(pattern, name)), None)


class ConfigFieldError(ValueError):
    """config.json lacks a field the architecture needs, or has it with the wrong type."""


def _int(config: Mapping, key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigFieldError(f"'{key}' is {value!r}; the architecture needs a positive integer")
    return value


def _decoder_common(spec: ModelSpec, text: Mapping, prefix: str, tie_default: bool) -> tuple[int, int, int, int]:
    hidden, vocab = _int(text, "hidden_size"), _int(text, "vocab_size")
    intermediate = _int(text, "intermediate_size")
    heads = _int(text, "num_attention_heads")
    spec.tensors[f"{prefix}embed_tokens.weight"] = (vocab, hidden)
    spec.tensors[f"{prefix}norm.weight"] = (hidden,)
    spec.linears["lm_head"] = (vocab, hidden)
    if text.get("tie_word_embeddings", tie_default):
        spec.optional.add("lm_head")  # vLLM ties it to the embedding when the checkpoint leaves it out
    for layer in range(spec.layers):
        _norms_and_mlp(spec, f"{prefix}layers.{layer}.", hidden, intermediate)
    return hidden, heads, _int(text, "num_key_value_heads", heads), _int(text, "head_dim", hidden // heads)


def _norms_and_mlp(spec: ModelSpec, p: str, hidden: int, intermediate: int) -> None:
    """What every decoder layer has besides its token mixer: the two RMSNorms and the gated MLP."""
    spec.tensors[f"{p}input_layernorm.weight"] = (hidden,)
    spec.tensors[f"{p}post_attention_layernorm.weight"] = (hidden,)
    spec.linears[f"{p}mlp.gate_proj"] = (intermediate, hidden)
    spec.linears[f"{p}mlp.up_proj"] = (intermediate, hidden)
    spec.linears[f"{p}mlp.down_proj"] = (hidden, intermediate)


def _attention(spec: ModelSpec, p: str, hidden: int, heads: int, kv_heads: int, head_dim: int, *,
               qk_norm: bool, output_gate: bool = False) -> None:
    spec.linears[f"{p}self_attn.q_proj"] = (heads * head_dim * (2 if output_gate else 1), hidden)
    spec.linears[f"{p}self_attn.k_proj"] = (kv_heads * head_dim, hidden)
    spec.linears[f"{p}self_attn.v_proj"] = (kv_heads * head_dim, hidden)
    spec.linears[f"{p}self_attn.o_proj"] = (hidden, heads * head_dim)
    if qk_norm:
        spec.tensors[f"{p}self_attn.q_norm.weight"] = (head_dim,)
        spec.tensors[f"{p}self_attn.k_norm.weight"] = (head_dim,)


def _dense_decoder(config: Mapping, architecture: str, qk_norm: bool) -> ModelSpec:
    spec = ModelSpec(architecture, _int(config, "num_hidden_layers"))
    spec.biases = bool(config.get("attention_bias") or config.get("mlp_bias"))
    hidden, heads, kv_heads, head_dim = _decoder_common(spec, config, "model.", tie_default=False)
    for layer in range(spec.layers):
        _attention(spec, f"model.layers.{layer}.", hidden, heads, kv_heads, head_dim, qk_norm=qk_norm)
    # Old exports store the rotary frequencies; vLLM recomputes and skips them.
    spec.loose[r".*\.rotary_emb\.inv_freq$"] = "rotary frequencies"
    return spec


def _qwen3_5(config: Mapping, architecture: str) -> ModelSpec:
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise ConfigFieldError(f"'text_config' is {type(text).__name__}; {architecture} needs an object")
    spec = ModelSpec(architecture, _int(text, "num_hidden_layers"))
    tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    hidden, heads, kv_heads, head_dim = _decoder_common(spec, {**text, "tie_word_embeddings": tie},
                                                        "model.language_model.", tie_default=False)
    key_heads, value_heads = _int(text, "linear_num_key_heads"), _int(text, "linear_num_value_heads")
    key_dim, value_dim = _int(text, "linear_key_head_dim"), _int(text, "linear_value_head_dim")
    conv_kernel = _int(text, "linear_conv_kernel_dim")
    layer_types = text.get("layer_types") or [
        "full_attention" if (layer + 1) % _int(text, "full_attention_interval", 4) == 0 else "linear_attention"
        for layer in range(spec.layers)]
    if not isinstance(layer_types, list) or len(layer_types) != spec.layers:
        raise ConfigFieldError(f"'layer_types' does not list one type per layer ({spec.layers} layers)")
    qkv = 2 * key_heads * key_dim + value_heads * value_dim
    for layer, kind in enumerate(layer_types):
        p = f"model.language_model.layers.{layer}."
        if kind == "full_attention":
            _attention(spec, p, hidden, heads, kv_heads, head_dim, qk_norm=True,
                       output_gate=bool(text.get("attn_output_gate", True)))
        elif kind == "linear_attention":
            gdn = f"{p}linear_attn."
            spec.linears.update({f"{gdn}in_proj_qkv": (qkv, hidden),
                                 f"{gdn}in_proj_z": (value_heads * value_dim, hidden),
                                 f"{gdn}in_proj_b": (value_heads, hidden), f"{gdn}in_proj_a": (value_heads, hidden),
                                 f"{gdn}out_proj": (hidden, value_heads * value_dim)})
            spec.tensors.update({f"{gdn}conv1d.weight": (qkv, 1, conv_kernel), f"{gdn}A_log": (value_heads,),
                                 f"{gdn}dt_bias": (value_heads,), f"{gdn}norm.weight": (value_dim,)})
        else:
            raise ConfigFieldError(f"'layer_types' names layer {layer} '{kind}'; expected full_attention or "
                                   "linear_attention")
    if isinstance(config.get("vision_config"), Mapping):
        _vision_tower(spec, config["vision_config"], hidden)
    _mtp_head(spec, text, hidden, heads, kv_heads, head_dim)
    return spec


def _mtp_head(spec: ModelSpec, text: Mapping, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
    """The multi-token-prediction module (``mtp_num_hidden_layers`` full-attention decoder layers behind an fc over
    [embedding, hidden]). Optional: vLLM reads it only when speculating, and some exports drop it; where it is
    stored, its tensors are held to these shapes and their own quantization scheme (16 bits or NVFP4)."""
    layers = text.get("mtp_num_hidden_layers", 0)
    if layers in (0, None):
        return
    layers = _int(text, "mtp_num_hidden_layers")
    names = {"mtp.fc": None}
    spec.linears["mtp.fc"] = (hidden, 2 * hidden)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        names[f"mtp.{norm}.weight"] = spec.tensors[f"mtp.{norm}.weight"] = (hidden,)
    before = set(spec.linears) | set(spec.tensors)
    intermediate = _int(text, "intermediate_size")
    for layer in range(layers):
        p = f"mtp.layers.{layer}."
        _norms_and_mlp(spec, p, hidden, intermediate)
        _attention(spec, p, hidden, heads, kv_heads, head_dim, qk_norm=True,
                   output_gate=bool(text.get("attn_output_gate", True)))
    spec.optional.update(names, (set(spec.linears) | set(spec.tensors)) - before)


def _vision_tower(spec: ModelSpec, vision: Mapping, text_hidden: int) -> None:
    """The Qwen3.5 vision tower vLLM loads unless asked for text only: the tensors named here must be present with
    these shapes (stored in 16 bits); any other tensor under model.visual is left to vLLM's model code."""
    width, inner = _int(vision, "hidden_size"), _int(vision, "intermediate_size", 4 * _int(vision, "hidden_size"))
    merged = width * _int(vision, "spatial_merge_size", 2) ** 2
    patch, temporal = _int(vision, "patch_size", 16), _int(vision, "temporal_patch_size", 2)
    v = "model.visual."
    spec.tensors[f"{v}patch_embed.proj.weight"] = (width, _int(vision, "in_channels", 3), temporal, patch, patch)
    spec.tensors[f"{v}patch_embed.proj.bias"] = (width,)
    if "num_position_embeddings" in vision:
        spec.tensors[f"{v}pos_embed.weight"] = (_int(vision, "num_position_embeddings"), width)
    for block in range(_int(vision, "depth")):
        b = f"{v}blocks.{block}."
        for norm in ("norm1", "norm2"):
            spec.tensors.update({f"{b}{norm}.weight": (width,), f"{b}{norm}.bias": (width,)})
        for name, rows, cols in (("attn.qkv", 3 * width, width), ("attn.proj", width, width),
                                 ("mlp.linear_fc1", inner, width), ("mlp.linear_fc2", width, inner)):
            spec.tensors.update({f"{b}{name}.weight": (rows, cols), f"{b}{name}.bias": (rows,)})
    out = _int(vision, "out_hidden_size", text_hidden)
    spec.tensors.update({f"{v}merger.norm.weight": (width,), f"{v}merger.norm.bias": (width,),
                         f"{v}merger.linear_fc1.weight": (merged, merged), f"{v}merger.linear_fc1.bias": (merged,),
                         f"{v}merger.linear_fc2.weight": (out, merged), f"{v}merger.linear_fc2.bias": (out,)})
    spec.loose[r"model\.visual\."] = "the vision tower (vision_config)"


def vision_tensor_shapes(vision: Mapping, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """The vision tower's tensors (name → shape) that a Qwen3.5 ``vision_config`` describes."""
    spec = ModelSpec("vision tower", 0)
    _vision_tower(spec, vision, text_hidden)
    return spec.tensors


_BUILDERS = {
    "LlamaForCausalLM": lambda config, arch: _dense_decoder(config, arch, qk_norm=False),
    "Qwen3ForCausalLM": lambda config, arch: _dense_decoder(config, arch, qk_norm=True),
    "Qwen3_5ForConditionalGeneration": _qwen3_5,
}


def architecture_of(config: Mapping) -> str | None:
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return None


def model_spec(config: Mapping) -> ModelSpec | None:
    """What config.json's architecture needs, or None for an architecture not in the table. Raises
    ConfigFieldError when the architecture is known but a field it needs is missing or malformed."""
    architecture = architecture_of(config)
    builder = _BUILDERS.get(architecture or "")
    return None if builder is None else builder(config, architecture)


def known_architectures() -> tuple[str, ...]:
    return tuple(_BUILDERS)
