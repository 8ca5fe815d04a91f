"""Tiny random Hugging Face models written as NVFP4 checkpoints, made locally (no hub is reachable in tests).

``make_tiny_checkpoint(dest, arch="llama", fmt="modelopt-nvfp4")`` writes config.json, a locally trained BPE
tokenizer and sharded safetensors exactly as the named producer lays them out. Widths are multiples of 16 but not
powers of two (hidden 320, intermediate 864) so kernels and loaders meet realistic odd shapes. q, k and v (and gate
and up) are quantized separately, so each shard of a fused layer has its own global scale, as in real checkpoints.
``make_checkpoint(dest, shape, fmt, device=...)`` writes the same for any ``TinyArch`` or ``HybridArch`` shape, e.g.
a few layers at real widths for benchmarks, made on a GPU. ``stream_hybrid_checkpoint`` writes a HybridArch of any
depth (the full 64-layer Qwen3.8-27B: ~17 GB) one decoder layer at a time, never holding the dense model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_volta_fp4.format.nvfp4 import quantize_fp8, quantize_nvfp4

FORMATS = ("modelopt-nvfp4", "modelopt-w4a16", "modelopt-mixed", "ct-w4a16", "ct-w4a4")
ARCHS = ("llama", "qwen3", "qwen3_5")
MTP_STORAGE = ("unquantized", "nvfp4")
"""How a Qwen3.5 checkpoint's MTP module is stored: excluded from quantization, as real exports ship it, or with its
decoder layer quantized like the main model's (its fc stays in 16 bits and excluded, as ModelOpt leaves it)."""


@dataclass(frozen=True)
class TinyArch:
    architecture: str
    model_type: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    qk_norm: bool


@dataclass(frozen=True)
class HybridArch:
    """Qwen3_5ForConditionalGeneration's text model: Gated-DeltaNet (linear attention) layers with a gated
    full-attention layer every ``full_attention_interval``-th, partial rotary 0.25 (mrope_section: the rotary
    frequency pairs per position axis, head_dim / 8 of them), plus a one-block vision tower."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_head_dim: int
    conv_kernel: int
    mrope_section: tuple[int, int, int]
    full_attention_interval: int = 4
    mtp_layers: int = 0  # config.json's mtp_num_hidden_layers: the MTP module's decoder layers (real exports: 1)
    max_positions: int = 4096  # max_position_embeddings: the longest max-model-len vLLM accepts without an override


def qwen3_8_27b(layers: int) -> HybridArch:
    """``layers`` decoder layers of Qwen3.8-27B (3 GDN : 1 full attention, as in its 64; tests/data/
    qwen3.8-27b-config.json): hidden 5120, intermediate 17408, 24 query / 4 KV heads of 256 with output gate,
    GDN 16 key / 48 value heads of 128, conv kernel 4, mrope_section [11, 11, 10], 262,144 positions."""
    return HybridArch(5120, 17408, 24, 4, 256, layers, 16, 48, 128, 4, (11, 11, 10), max_positions=262144)


_ARCHS = {
    # 8 query / 2 KV heads: tensor parallel 2, 4 and 8 all divide the heads (KV heads are replicated past 2).
    # Llama's 864 splits into 16-element blocks at TP 2 only (a TP-4 split is the "clear error" case); Qwen3's 640
    # splits at TP 2, 4 and 8.
    "llama": TinyArch("LlamaForCausalLM", "llama", 320, 864, 8, 2, 64, 2, False),
    "qwen3": TinyArch("Qwen3ForCausalLM", "qwen3", 256, 640, 8, 2, 64, 2, True),
    "qwen3_5": HybridArch(256, 640, 8, 2, 64, 4, 2, 4, 64, 4, (4, 2, 2)),
}

_CORPUS = [
    "hello world", "the quick brown fox jumps over the lazy dog", "the capital of france is paris",
    "my name is volta and i run on old gpus", "one two three four five six seven eight nine ten",
    "a v100 has thirty two gigabytes of memory", "what is the kv cache", "nvfp4 packs two values per byte",
]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|endoftext|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_arch(arch: str) -> TinyArch | HybridArch:
    """The shape behind make_tiny_checkpoint's ``arch`` (one of ARCHS)."""
    return _ARCHS[arch]


def write_tokenizer(dest: Path, vocab_size: int = 384, corpus: list[str] | None = None) -> int:
    """Train a byte-level BPE tokenizer on a small fixed corpus (or ``corpus``); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<unk>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or _CORPUS * 20, trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|endoftext|>",
        "unk_token": "<unk>", "pad_token": "<|pad|>", "model_max_length": 4096, "chat_template": _CHAT_TEMPLATE,
    }, indent=1))
    return tokenizer.get_vocab_size()


def _hf_config(arch: TinyArch, vocab: int) -> dict:
    config = {
        "architectures": [arch.architecture], "model_type": arch.model_type, "hidden_size": arch.hidden,
        "intermediate_size": arch.intermediate, "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads, "head_dim": arch.head_dim, "num_hidden_layers": arch.layers,
        "vocab_size": vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 0,
        "torch_dtype": "float16",
    }
    if arch.model_type == "qwen3":
        config.update(attention_bias=False, attention_dropout=0.0)
    return config


def random_weights(arch: TinyArch, vocab: int, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """float32 weights with a spread large enough that greedy decoding is not a string of near-ties (made on
    ``device``: a CUDA device makes large benchmark models quickly)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device) * std

    h, i = arch.hidden, arch.intermediate
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    weights = {"model.embed_tokens.weight": normal(vocab, h, std=1.0), "model.norm.weight": torch.ones(h),
               "lm_head.weight": normal(vocab, h, std=h**-0.5)}
    for layer in range(arch.layers):
        p = f"model.layers.{layer}"
        # Each projection gets its own magnitude, so fused shards really have different global scales.
        for name, (rows, cols), std in [("self_attn.q_proj", (q, h), 1.0), ("self_attn.k_proj", (kv, h), 0.5),
                                        ("self_attn.v_proj", (kv, h), 2.0), ("self_attn.o_proj", (h, q), 1.0),
                                        ("mlp.gate_proj", (i, h), 1.5), ("mlp.up_proj", (i, h), 0.7),
                                        ("mlp.down_proj", (h, i), 1.0)]:
            weights[f"{p}.{name}.weight"] = normal(rows, cols, std=std * cols**-0.5)
        weights[f"{p}.input_layernorm.weight"] = 1 + normal(h, std=0.1)
        weights[f"{p}.post_attention_layernorm.weight"] = 1 + normal(h, std=0.1)
        if arch.qk_norm:
            weights[f"{p}.self_attn.q_norm.weight"] = 1 + normal(arch.head_dim, std=0.1)
            weights[f"{p}.self_attn.k_norm.weight"] = 1 + normal(arch.head_dim, std=0.1)
    return weights


# Decoder-layer projections are quantized; what real NVFP4 exports of Qwen3.5 leave in 16 bits is excluded: the
# Gated-DeltaNet b/a projections (tiny, precision-critical), the vision tower and lm_head. Everything else that is not
# a projection (norms, conv1d, A_log, dt_bias, embeddings) is never a quantization target.
_DECODER_PROJECTION = re.compile(
    r"^model\.(language_model\.)?layers\.\d+\.(self_attn|linear_attn|mlp)\.\w*proj\w*\.weight$")
_MTP_PROJECTION = re.compile(r"^mtp\.layers\.\d+\.(self_attn|mlp)\.\w*proj\.weight$")
_LEFT_IN_16_BITS = re.compile(r".*\.linear_attn\.in_proj_[ab]\.weight$")
MODELOPT_EXCLUDES = ["lm_head", "model.visual*", "*.linear_attn.in_proj_a", "*.linear_attn.in_proj_b"]
CT_IGNORE = ["lm_head", "re:model\\.visual\\..*", "re:.*\\.linear_attn\\.in_proj_[ab]$"]
# The MTP module, as real exports exclude it (Qwen3.8-27B's ModelOpt exclude_modules has "*mtp*"), and the fc that
# stays in 16 bits when the MTP decoder layer is quantized.
MODELOPT_MTP_EXCLUDES, CT_MTP_IGNORE = ["*mtp*"], ["re:.*mtp.*"]
MTP_FC_EXCLUDES = ["mtp.fc"]


def qwen3_5_config(shape: HybridArch, vocab: int) -> dict:
    """config.json of a Qwen3_5ForConditionalGeneration of ``shape`` (vision tower: one 64-wide block)."""
    from transformers import Qwen3_5Config

    layer_types = ["full_attention" if (layer + 1) % shape.full_attention_interval == 0 else "linear_attention"
                   for layer in range(shape.layers)]
    text = dict(vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim, linear_num_key_heads=shape.gdn_key_heads,
                linear_num_value_heads=shape.gdn_value_heads, linear_key_head_dim=shape.gdn_head_dim,
                linear_value_head_dim=shape.gdn_head_dim, linear_conv_kernel_dim=shape.conv_kernel,
                full_attention_interval=shape.full_attention_interval, layer_types=layer_types,
                max_position_embeddings=shape.max_positions, tie_word_embeddings=False, eos_token_id=0, bos_token_id=1,
                pad_token_id=3, mtp_num_hidden_layers=shape.mtp_layers,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                 "mrope_interleaved": True, "mrope_section": list(shape.mrope_section)})
    vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=shape.hidden,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=64)
    special = {"image_token_id": vocab - 4, "video_token_id": vocab - 3, "vision_start_token_id": vocab - 2,
               "vision_end_token_id": vocab - 1}
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False, **special)
    # save_pretrained would add the architecture; without it vLLM serves the bare Qwen3_5Model as an embedder
    return {**config.to_dict(), "architectures": ["Qwen3_5ForConditionalGeneration"]}


def qwen3_5_model(config: dict, seed: int = 0, device: str = "cpu"):
    """A Qwen3_5ForConditionalGeneration built by transformers itself on ``device``, so names, shapes and
    initialisation are exactly its own: linear, conv1d and embedding weights N(0, 0.02), the (1 + w) RMSNorms zero,
    the gated output norm one, dt_bias one, A_log = log U(0.01, 16). "meta" gives names and shapes without values;
    a CUDA device makes real widths quickly."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen3_5ForConditionalGeneration(Qwen3_5Config.from_dict(config))


def qwen3_5_weights(config: dict, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """float32 weights of qwen3_5_model(config, seed, device)."""
    model = qwen3_5_model(config, seed, device)
    return {name: tensor.detach().float().contiguous() for name, tensor in model.state_dict().items()}


def _is_quantized_linear(name: str, quantize_mtp: bool = False) -> bool:
    if _MTP_PROJECTION.match(name):
        return quantize_mtp
    return bool(_DECODER_PROJECTION.match(name)) and not _LEFT_IN_16_BITS.match(name)


def _is_attention(name: str) -> bool:
    return ".self_attn." in name or ".linear_attn." in name


def _quantize_tensors(weights: dict[str, torch.Tensor], fmt: str,
                      quantize_mtp: bool = False) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        module = name.removesuffix(".weight")
        if not _is_quantized_linear(name, quantize_mtp):
            out[name] = tensor.to(torch.float16)
            continue
        if fmt == "modelopt-mixed" and _is_attention(name):
            fp8_weight, scale = quantize_fp8(tensor)
            out.update({f"{module}.weight": fp8_weight, f"{module}.weight_scale": scale.reshape(()),
                        f"{module}.input_scale": torch.tensor(0.05)})
            continue
        quantized = quantize_nvfp4(tensor)
        activation_scale = torch.tensor(0.02)  # what a W4A4 calibration writes; this plugin ignores it
        if fmt.startswith("modelopt"):
            out.update({f"{module}.weight": quantized.packed, f"{module}.weight_scale": quantized.block_scale,
                        f"{module}.weight_scale_2": quantized.global_scale.reshape(())})
            if fmt in ("modelopt-nvfp4", "modelopt-mixed"):
                out[f"{module}.input_scale"] = activation_scale
        else:
            out.update({f"{module}.weight_packed": quantized.packed, f"{module}.weight_scale": quantized.block_scale,
                        f"{module}.weight_global_scale": (1.0 / quantized.global_scale).reshape(1)})
            if fmt == "ct-w4a4":
                out[f"{module}.input_global_scale"] = (1.0 / activation_scale).reshape(1)
    return out


def _exclusions(producer_excludes: list[str], mtp_excludes: list[str], weights: dict[str, torch.Tensor],
                quantize_mtp: bool) -> list[str]:
    if not any(name.startswith("mtp.") for name in weights):
        return producer_excludes
    return producer_excludes + (MTP_FC_EXCLUDES if quantize_mtp else mtp_excludes)


def _quant_config(fmt: str, weights: dict[str, torch.Tensor], quantize_mtp: bool = False) -> tuple[str, dict]:
    """(file it belongs in, config). ModelOpt NVFP4 uses the legacy hf_quant_config.json; newer ModelOpt exports
    (used here for W4A16 and mixed) and compressed-tensors put the config in config.json."""
    modelopt_excludes = _exclusions(MODELOPT_EXCLUDES, MODELOPT_MTP_EXCLUDES, weights, quantize_mtp)
    if fmt == "modelopt-nvfp4":
        return "hf_quant_config.json", {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {
            "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": modelopt_excludes}}
    if fmt.startswith("modelopt"):
        config = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4" if fmt == "modelopt-w4a16" else
                  "MIXED_PRECISION", "group_size": 16, "ignore": modelopt_excludes, "producer": {"name": "modelopt",
                  "version": "0.39.0"}}
        if fmt == "modelopt-mixed":
            config["quantized_layers"] = {
                name.removesuffix(".weight"): ({"quant_algo": "FP8"} if _is_attention(name)
                                               else {"quant_algo": "NVFP4", "group_size": 16})
                for name in weights if _is_quantized_linear(name, quantize_mtp)}
        return "config.json", config
    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
           "dynamic": False}
    group = {"targets": ["Linear"], "weights": fp4,
             "input_activations": {**fp4, "dynamic": "local"} if fmt == "ct-w4a4" else None}
    return "config.json", {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                           "quantization_status": "compressed", "config_groups": {"group_0": group},
                           "ignore": _exclusions(CT_IGNORE, CT_MTP_IGNORE, weights, quantize_mtp)}


def save_sharded(tensors: dict[str, torch.Tensor], dest: Path, shards: int = 2) -> None:
    """Write ``tensors`` as ``shards`` safetensors files plus model.safetensors.index.json."""
    names = list(tensors)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[index * per_shard:(index + 1) * per_shard]
        save_file({name: tensors[name].contiguous().cpu() for name in chunk}, str(dest / file),
                  metadata={"format": "pt"})
        weight_map.update({name: file for name in chunk})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def make_tiny_checkpoint(dest: str | Path, arch: str = "llama", fmt: str = "modelopt-nvfp4", seed: int = 0,
                         head_dim: int | None = None, mtp: str | None = None) -> Path:
    """Write a tiny random model of ``arch`` as an NVFP4 checkpoint in producer format ``fmt``; ``head_dim``
    overrides the attention head size of the llama and qwen3 models (64) to exercise other attention kernels;
    ``mtp`` (one of MTP_STORAGE) adds a one-layer MTP module to the qwen3_5 model."""
    if arch not in ARCHS or fmt not in FORMATS:
        raise ValueError(f"arch must be one of {ARCHS} and fmt one of {FORMATS}")
    if head_dim is not None and not isinstance(_ARCHS[arch], TinyArch):
        raise ValueError("head_dim can be chosen for the llama and qwen3 models only")
    if mtp is not None and (arch != "qwen3_5" or mtp not in MTP_STORAGE):
        raise ValueError(f"mtp ({MTP_STORAGE}) can be chosen for the qwen3_5 model only")
    shape = _ARCHS[arch] if head_dim is None else dataclasses.replace(_ARCHS[arch], head_dim=head_dim)
    if mtp is not None:
        shape = dataclasses.replace(shape, mtp_layers=1)
    return make_checkpoint(dest, shape, fmt, seed, quantize_mtp=mtp == "nvfp4")


def make_checkpoint(dest: str | Path, shape: TinyArch | HybridArch, fmt: str = "modelopt-nvfp4", seed: int = 0,
                    device: str = "cpu", quantize_mtp: bool = False) -> Path:
    """Write a random model of any ``shape`` (e.g. a few layers at real widths, for benchmarks) as an NVFP4
    checkpoint in producer format ``fmt``, generated and quantized on ``device``: Llama/Qwen3 for a TinyArch,
    Qwen3_5ForConditionalGeneration for a HybridArch (with ``shape.mtp_layers`` MTP layers, quantized if
    ``quantize_mtp``, else excluded as real exports exclude them)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(dest)
    if isinstance(shape, HybridArch):
        config = qwen3_5_config(shape, vocab)
        weights = qwen3_5_weights(config, seed, device)
        if shape.mtp_layers:
            from vllm_volta_fp4.testing.mtp_head import mtp_weights

            weights.update({name: tensor.to(device) for name, tensor in mtp_weights(config, seed + 1).items()})
        return write_checkpoint(dest, weights, config, fmt, quantize_mtp)
    return write_checkpoint(dest, random_weights(shape, vocab, seed, device), _hf_config(shape, vocab), fmt)


def write_checkpoint(dest: Path, weights: dict[str, torch.Tensor], config: dict, fmt: str,
                     quantize_mtp: bool = False) -> Path:
    """Quantize float ``weights`` (Hugging Face names, plus ``mtp.*``) into ``dest`` as producer format ``fmt``
    writes them, with ``config`` as config.json (a tokenizer must already be there)."""
    _write_configs(dest, config, fmt, weights, quantize_mtp)
    save_sharded(_quantize_tensors(weights, fmt, quantize_mtp), dest)
    return dest


def _write_configs(dest: Path, config: dict, fmt: str, tensors: dict, quantize_mtp: bool = False) -> None:
    """config.json, the quantization config where producer ``fmt`` keeps it (inside config.json or a file of its
    own) for the checkpoint tensors named by ``tensors``' keys, and generation_config.json."""
    config_file, quant_config = _quant_config(fmt, tensors, quantize_mtp)
    if config_file == "config.json":
        config["quantization_config"] = quant_config
    else:
        (dest / config_file).write_text(json.dumps(quant_config, indent=1))
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    (dest / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 0}))


# ---------------------------------------------------------------- streaming writer (full-depth models)

_ZERO_CENTRED_NORM = re.compile(
    r"(input_layernorm|post_attention_layernorm|q_norm|k_norm|language_model\.norm)\.weight$")


def _initial_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator, device: str) -> torch.Tensor:
    """A float32 tensor initialised as qwen3_5_model's transformers initialisation does for ``name``: the (1 + w)
    RMSNorms zero, other norm weights and dt_bias one, biases zero, A_log = log U(0.01, 16), the rest N(0, 0.02)."""
    if _ZERO_CENTRED_NORM.search(name) or name.endswith(".bias"):
        return torch.zeros(shape, device=device)
    if "norm" in name and name.endswith(".weight") or name.endswith("dt_bias"):
        return torch.ones(shape, device=device)
    if name.endswith("A_log"):
        return torch.empty(shape, device=device).uniform_(0.01, 16, generator=generator).log_()
    return torch.randn(shape, generator=generator, device=device) * 0.02


def _layer_of(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name)
    return int(match.group(1)) if match and "visual" not in name else None


def stream_hybrid_checkpoint(dest: str | Path, shape: HybridArch, fmt: str = "ct-w4a16", seed: int = 0,
                             device: str = "cpu", layers_per_shard: int = 4, vocab: int | None = None,
                             progress=print) -> Path:
    """Write a random Qwen3_5ForConditionalGeneration of ``shape`` as an NVFP4 checkpoint in producer format
    ``fmt``, one decoder layer at a time: each layer's float32 weights are made on ``device``, quantized there and
    written with the other layers of its shard (``layers_per_shard`` layers a file; embeddings and the vision tower
    first, then the layers, then ``shape.mtp_layers``' MTP module as make_checkpoint writes it, lm_head last), so
    memory holds one shard of quantized tensors, never the dense model. Names and shapes are transformers' own (the
    model built on the meta device); values follow its initialisation rules (_initial_tensor). ``vocab`` (default:
    the local tokenizer's) sets the vocabulary, e.g. 248,320 for the real model; token ids beyond the tokenizer's
    are never produced by it but exist in the embeddings and lm_head."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    vocab = max(vocab or 0, write_tokenizer(dest))
    config = qwen3_5_config(shape, vocab)
    names = {name: tuple(t.shape) for name, t in qwen3_5_model(config, device="meta").state_dict().items()}
    mtp: dict[str, torch.Tensor] = {}
    if shape.mtp_layers:  # the MTP module (16-bit, excluded as real exports ship it): one shard before lm_head
        from vllm_volta_fp4.testing.mtp_head import mtp_weights

        mtp = mtp_weights(config, seed + 1)
        names.update({name: tuple(t.shape) for name, t in mtp.items()})
    _write_configs(dest, config, fmt, names)
    model = [n for n in names if n not in mtp]
    groups: list[list[str]] = [[n for n in model if _layer_of(n) is None and not n.startswith("lm_head")]]
    for first in range(0, shape.layers, layers_per_shard):
        groups.append([n for n in model if _layer_of(n) in range(first, first + layers_per_shard)])
    groups += [list(mtp)] if mtp else []
    groups.append([n for n in model if n.startswith("lm_head")])
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for index, group in enumerate(groups):
        file = f"model-{index + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for layer in dict.fromkeys(_layer_of(n) for n in group):  # one layer's dense weights at a time
            dense = {n: mtp[n].to(device) if n in mtp else _initial_tensor(n, names[n], generator, device)
                     for n in group if _layer_of(n) == layer}
            tensors.update({n: t.contiguous().cpu() for n, t in _quantize_tensors(dense, fmt).items()})
            del dense
        save_file(tensors, str(dest / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        progress(f"  {file}: {len(tensors)} tensors, {total / 1e9:.2f} GB written so far")
        del tensors
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return dest
