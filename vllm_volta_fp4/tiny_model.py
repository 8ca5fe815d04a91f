"""Tiny random Hugging Face models written as NVFP4 checkpoints, made locally (no hub is reachable in tests).

``make_tiny_checkpoint(dest, arch="llama", fmt="modelopt-nvfp4")`` writes config.json, a locally trained BPE
tokenizer and sharded safetensors exactly as the named producer lays them out. Widths are multiples of 16 but not
powers of two (hidden 320, intermediate 864) so kernels and loaders meet realistic odd shapes. q, k and v (and gate
and up) are quantized separately, so each shard of a fused layer has its own global scale, as in real checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_volta_fp4.nvfp4 import quantize_fp8, quantize_nvfp4

FORMATS = ("modelopt-nvfp4", "modelopt-w4a16", "modelopt-mixed", "ct-w4a16", "ct-w4a4")
ARCHS = ("llama", "qwen3", "qwen3_5")


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


_ARCHS = {
    # 8 query / 2 KV heads: tensor parallel 2, 4 and 8 all divide the heads (KV heads are replicated past 2).
    # Llama's 864 splits into 16-element blocks at TP 2 only (a TP-4 split is the "clear error" case); Qwen3's 640
    # splits at TP 2, 4 and 8.
    "llama": TinyArch("LlamaForCausalLM", "llama", 320, 864, 8, 2, 64, 2, False),
    "qwen3": TinyArch("Qwen3ForCausalLM", "qwen3", 256, 640, 8, 2, 64, 2, True),
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


def write_tokenizer(dest: Path, vocab_size: int = 384) -> int:
    """Train a byte-level BPE tokenizer on a small fixed corpus; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<unk>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 20, trainer)
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
_DECODER_PROJECTION = re.compile(r"^model\.(language_model\.)?layers\.\d+\.(self_attn|linear_attn|mlp)\.\w*proj\w*\.weight$")
_LEFT_IN_16_BITS = re.compile(r".*\.linear_attn\.in_proj_[ab]\.weight$")
MODELOPT_EXCLUDES = ["lm_head", "model.visual*", "*.linear_attn.in_proj_a", "*.linear_attn.in_proj_b"]
CT_IGNORE = ["lm_head", "re:model\\.visual\\..*", "re:.*\\.linear_attn\\.in_proj_[ab]$"]


def _qwen3_5_weights_and_config(vocab: int, seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """A tiny Qwen3_5ForConditionalGeneration (3 Gated-DeltaNet layers + 1 gated full-attention layer, a one-block
    vision tower) initialised by transformers itself, so tensor names and shapes are exactly what it saves."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=256, intermediate_size=640, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, full_attention_interval=4,
                layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=4096,
                tie_word_embeddings=False, eos_token_id=0, bos_token_id=1, pad_token_id=3,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                 "mrope_interleaved": True, "mrope_section": [4, 2, 2]})
    vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=64)
    special = {"image_token_id": vocab - 4, "video_token_id": vocab - 3, "vision_start_token_id": vocab - 2,
               "vision_end_token_id": vocab - 1}
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False, **special)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    weights = {name: tensor.detach().float().contiguous() for name, tensor in model.state_dict().items()}
    # save_pretrained would add the architecture; without it vLLM serves the bare Qwen3_5Model as an embedder
    return weights, {**config.to_dict(), "architectures": ["Qwen3_5ForConditionalGeneration"]}


def _is_quantized_linear(name: str) -> bool:
    return bool(_DECODER_PROJECTION.match(name)) and not _LEFT_IN_16_BITS.match(name)


def _is_attention(name: str) -> bool:
    return ".self_attn." in name or ".linear_attn." in name


def _quantize_tensors(weights: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        module = name.removesuffix(".weight")
        if not _is_quantized_linear(name):
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


def _quant_config(fmt: str, weights: dict[str, torch.Tensor]) -> tuple[str, dict]:
    """(file it belongs in, config). ModelOpt NVFP4 uses the legacy hf_quant_config.json; newer ModelOpt exports
    (used here for W4A16 and mixed) and compressed-tensors put the config in config.json."""
    if fmt == "modelopt-nvfp4":
        return "hf_quant_config.json", {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {
            "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": MODELOPT_EXCLUDES}}
    if fmt.startswith("modelopt"):
        config = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4" if fmt == "modelopt-w4a16" else
                  "MIXED_PRECISION", "group_size": 16, "ignore": MODELOPT_EXCLUDES, "producer": {"name": "modelopt",
                  "version": "0.39.0"}}
        if fmt == "modelopt-mixed":
            config["quantized_layers"] = {
                name.removesuffix(".weight"): ({"quant_algo": "FP8"} if _is_attention(name)
                                               else {"quant_algo": "NVFP4", "group_size": 16})
                for name in weights if _is_quantized_linear(name)}
        return "config.json", config
    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
           "dynamic": False}
    group = {"targets": ["Linear"], "weights": fp4,
             "input_activations": {**fp4, "dynamic": "local"} if fmt == "ct-w4a4" else None}
    return "config.json", {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                           "quantization_status": "compressed", "config_groups": {"group_0": group},
                           "ignore": CT_IGNORE}


def save_sharded(tensors: dict[str, torch.Tensor], dest: Path, shards: int = 2) -> None:
    """Write ``tensors`` as ``shards`` safetensors files plus model.safetensors.index.json."""
    names = list(tensors)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[index * per_shard:(index + 1) * per_shard]
        save_file({name: tensors[name].contiguous().cpu() for name in chunk}, str(dest / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in chunk})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def make_tiny_checkpoint(dest: str | Path, arch: str = "llama", fmt: str = "modelopt-nvfp4", seed: int = 0,
                         head_dim: int | None = None) -> Path:
    """Write a tiny random model of ``arch`` as an NVFP4 checkpoint in producer format ``fmt``; ``head_dim``
    overrides the attention head size of the llama and qwen3 models (64) to exercise other attention kernels."""
    if arch not in ARCHS or fmt not in FORMATS:
        raise ValueError(f"arch must be one of {ARCHS} and fmt one of {FORMATS}")
    if head_dim is not None and arch not in _ARCHS:
        raise ValueError(f"head_dim can be chosen for {sorted(_ARCHS)} only")
    if arch == "qwen3_5":
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        vocab = write_tokenizer(dest)
        weights, config = _qwen3_5_weights_and_config(vocab, seed)
        return _write_checkpoint(dest, weights, config, fmt)
    shape = _ARCHS[arch] if head_dim is None else dataclasses.replace(_ARCHS[arch], head_dim=head_dim)
    return make_checkpoint(dest, shape, fmt, seed)


def make_checkpoint(dest: str | Path, shape: TinyArch, fmt: str = "modelopt-nvfp4", seed: int = 0,
                    device: str = "cpu") -> Path:
    """Write a random Llama/Qwen3-architecture model of any ``shape`` (e.g. a few layers at real widths, for
    benchmarks) as an NVFP4 checkpoint in producer format ``fmt``, generated and quantized on ``device``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(dest)
    return _write_checkpoint(dest, random_weights(shape, vocab, seed, device), _hf_config(shape, vocab), fmt)


def _write_checkpoint(dest: Path, weights: dict[str, torch.Tensor], config: dict, fmt: str) -> Path:
    config_file, quant_config = _quant_config(fmt, weights)
    if config_file == "config.json":
        config["quantization_config"] = quant_config
    else:
        (dest / config_file).write_text(json.dumps(quant_config, indent=1))
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    (dest / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 0}))
    save_sharded(_quantize_tensors(weights, fmt), dest)
    return dest
