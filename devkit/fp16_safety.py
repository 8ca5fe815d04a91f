"""fp16 safety of bf16-trained Qwen3.5 models: a stressed tiny model and an instrumented forward. No vLLM import.

A V100 has no bf16, so models trained in bf16 run in fp16 there (max finite 65504). What overflows is set by the
activation statistics bf16 training produces, which a randomly initialised test model does not have. This module

* gives the tiny ``Qwen3_5ForConditionalGeneration`` of ``tiny_model`` those statistics by deterministic weight
  edits (``stress_weights``):
    - **massive activations** — a few fixed residual-stream channels that reach 1e3–1e5 on the sequence-start token,
      appear abruptly in one early layer's MLP and then ride the residual stream unchanged through all later layers
      (Sun, Chen, Kolter, Liu, "Massive Activations in Large Language Models", arXiv:2402.17762; "A Single Layer to
      Explain Them All", arXiv:2605.08504: they emerge in one layer's FFN and propagate through the residual);
    - the mechanism behind them, a **super activation** in the ``down_proj`` input of that early MLP multiplied by a
      single **super weight** of ``down_proj`` (Yu et al., "The Super Weight in Large Language Models",
      arXiv:2411.07191) — the super weight is its NVFP4 block's largest element, so it is always encoded as E2M1 ±6;
    - **outlier channels** in the ``down_proj`` input of every token (a few intermediate channels 10–100× the rest,
      with correspondingly small down_proj columns: Dettmers et al., "LLM.int8()", arXiv:2208.07339);
    - **large attention logits**, via q/k-norm gains (what is left of attention-logit growth once q and k are
      RMS-normalised: |q·k| ≤ head_dim · max(1+w_q) · max(1+w_k)).
  Real symptoms of the same thing: Qwen2 in fp16 on V100 turns into NaN after layer 1 (QwenLM/Qwen3#826, #868);
  vLLM's Marlin NVFP4 path overflowed in fp16 on Qwen3 NVFP4 checkpoints (vllm-project/vllm#33972).
* runs the model (Hugging Face transformers, CPU) with hooks that record, per site, the largest |value| and
  whether it is finite (``instrumented_forward``), in fp32 (the reference) and in fp16. CPU fp16 in torch 2.13
  has every op this model uses; matmuls accumulate in fp32 and round the output once to fp16, as cuBLAS and our
  kernels' epilogues do, so the fp16 run needs no emulation. transformers itself keeps some sites in fp32 — the
  RMSNorm statistics, softmax, the GDN decay and the whole gated delta rule (it casts q/k/v to fp32) — as vLLM
  and our kernels do (RMSNorm variance and the GDN/attention accumulators are fp32 there too);
* stands for our linear kernels as they are: every path of weight_gemm.cuh (the tensor-core GEMV for M ≤ 16, the fused
  kernel, dequantize + cuBLAS) multiplies the fp16 input by weights decoded exactly to fp16 (w · 2^-8) with fp32
  accumulation and rounds the output once, which is what the fp16 matmul here does. (The CUDA-core GEMV it replaced
  summed 16-column groups in fp16, and that sum was the first overflow: a super activation meets its block's
  largest code ±6. tests/gpu/test_weight_gemm.py now checks that case on every path.)
* emulates where vLLM keeps the residual stream (``residual="vllm"``: fp32 for Qwen3.5 in fp16, sublayer outputs
  fp16) and a model override that also keeps the residual-writing projections' outputs in fp32
  (``residual="fp32-outputs"``).

Sites recorded (``L{i}.`` prefix per decoder layer): ``embed``, ``norm_in``, ``qkv`` / ``z`` (GDN projections),
``gdn_out`` and ``gdn_state`` (core output and final recurrent state), ``gdn_norm`` (gated RMSNorm), ``q`` / ``k`` /
``v`` (full attention projections; q includes the output gate), ``logits_qk`` (q·kᵀ before the softmax scale, which
is what an fp16 matmul rounds) and ``logits`` (scaled), ``mixer_out`` (out_proj / o_proj), ``resid_mid``
(residual after the mixer), ``norm_post``, ``gate``, ``up``, ``act`` (silu(gate)·up = down_proj input), ``down``,
``resid`` (layer output); ``final_norm``, ``lm_logits``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

FP16_MAX = 65504.0
FP16_OVERFLOW = 65520.0
RESIDUAL_MODES = ("model", "vllm", "fp32-outputs")  # the smallest magnitude that rounds to inf (round to nearest even)
PREFIX = "model.language_model"


@dataclass(frozen=True)
class Stress:
    """How strongly the weights imitate bf16-trained activation statistics (0 disables an effect).

    The massive residual value on the marker token is ``super_activation * super_weight`` (fp32); the defaults give
    a super activation of 2e4 and massive channels of 3e4: inside fp16 range and inside the 1e3–1e5 range reported
    for bf16-trained LLMs."""

    super_activation: float = 2.0e4      # |down_proj input| of the marker token on the super channel, in layer `layer`
    super_weight: float = 1.5            # the down_proj weight(s) that write it into the massive channels
    massive_channels: tuple[int, ...] = (37, 201)  # residual channels (signs alternate), as LLaMA2-7B's 1415 / 2533
    layer: int = 1                       # the "massive emergence" layer (early: counting from 0)
    super_channel: int = 123             # intermediate channel carrying the super activation
    marker_channel: int = 250            # embedding channel that marks the sequence-start token
    outlier_channels: tuple[int, ...] = (5, 300, 517)  # down_proj-input outlier channels (all tokens)
    outlier_layer: int = 2
    outlier_gain: float = 60.0           # gate/up rows × this, down_proj columns ÷ gain²: same residual contribution
    qk_gain: float = 20.0                # 1 + w of the q_norm / k_norm (full-attention layer) on `qk_dims`
    qk_dims: int = 4                     # first dims of each head that get the gain
    marker_token: int = 1                # bos


def build_model(seed: int = 0, vocab: int = 384):
    """The tiny Qwen3.5 of tiny_model (fp32, eval mode), as a transformers module."""
    from vllm_volta_fp4.testing import tiny_model

    model = tiny_model.qwen3_5_model(tiny_model.qwen3_5_config(tiny_model.tiny_arch("qwen3_5"), vocab), seed)
    model.config._attn_implementation = "eager"
    model.model.language_model.config._attn_implementation = "eager"
    return model.eval()


def _text(model):
    return model.model.language_model


@torch.no_grad()
def stress_weights(model, stress: Stress = Stress(), tokens: torch.Tensor | None = None):
    """Edit ``model`` (fp32, in place) so that fp32 activations have the statistics of ``stress``; returns it.

    Deterministic: only fixed channels are written. The super activation is calibrated with one fp32 forward of
    ``tokens`` (default ``example_tokens()``) so that it hits ``stress.super_activation`` on the marker token."""
    text = _text(model)
    tokens = example_tokens() if tokens is None else tokens
    embed = text.embed_tokens.weight
    layers = text.layers
    if stress.super_activation:
        # The marker channel is zero for every token but the sequence-start one, where it dominates the RMS norm.
        embed[:, stress.marker_channel] = 0
        embed[stress.marker_token, stress.marker_channel] = 1.0
        mlp = layers[stress.layer].mlp
        j, m = stress.super_channel, stress.marker_channel
        mlp.gate_proj.weight[j] = 0
        mlp.up_proj.weight[j] = 0
        mlp.gate_proj.weight[j, m] = 1.0  # silu(x_m) with x_m ≈ 16 after the norm: ≈ identity
        mlp.up_proj.weight[j, m] = 1.0
        mlp.down_proj.weight[:, j] = 0
        for index, channel in enumerate(stress.massive_channels):
            mlp.down_proj.weight[channel, j] = stress.super_weight * (-1) ** index
        # calibrate: act_j = silu(x_m) * x_m * gain_up, linear in the up_proj gain
        seen = record_site(model, f"{PREFIX}.layers.{stress.layer}.mlp.down_proj", tokens, pre=True)
        mlp.up_proj.weight[j, m] = stress.super_activation / seen[0, 0, j].abs().item()
    if stress.outlier_gain and stress.outlier_gain != 1:
        mlp = layers[stress.outlier_layer].mlp
        gate = record_site(model, f"{PREFIX}.layers.{stress.outlier_layer}.mlp.gate_proj", tokens)
        up = record_site(model, f"{PREFIX}.layers.{stress.outlier_layer}.mlp.up_proj", tokens)
        for channel in stress.outlier_channels:
            # signs chosen so that silu(gate) is open and gate·up > 0 on average: a large product on every token
            gate_sign = 1.0 if gate[..., channel].mean() >= 0 else -1.0
            up_sign = 1.0 if up[..., channel].mean() >= 0 else -1.0
            mlp.gate_proj.weight[channel] *= stress.outlier_gain * gate_sign
            mlp.up_proj.weight[channel] *= stress.outlier_gain * up_sign
            mlp.down_proj.weight[:, channel] /= stress.outlier_gain**2
    if stress.qk_gain and stress.qk_gain != 1:
        for layer in layers:
            if hasattr(layer, "self_attn"):
                for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                    norm.weight[: stress.qk_dims] = stress.qk_gain - 1  # Qwen3.5's RMSNorm multiplies by 1 + w
    return model


def example_tokens(length: int = 12, vocab: int = 300, seed: int = 0) -> torch.Tensor:
    """[1, length] ids: the marker (bos) token, then fixed pseudo-random ordinary tokens."""
    generator = torch.Generator().manual_seed(seed)
    body = torch.randint(4, vocab, (1, length - 1), generator=generator)
    return torch.cat([torch.tensor([[1]]), body], dim=1)


@torch.no_grad()
def record_site(model, module_name: str, tokens: torch.Tensor, pre: bool = False) -> torch.Tensor:
    """One forward; returns the input (``pre``) or output of the named module."""
    module = model.get_submodule(module_name)
    seen = []
    if pre:
        handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    else:
        handle = module.register_forward_hook(lambda _m, _a, out: seen.append(out.detach().clone()))
    try:
        model(input_ids=tokens)
    finally:
        handle.remove()
    return seen[0]


# ─── the instrumented forward ─────────────────────────────────────────────────────────────────────────────────────
@dataclass
class SiteStats:
    max_abs: float                       # largest finite |value|
    finite: bool                         # every value finite
    order: int                           # execution order (first seen)


@dataclass
class Record:
    dtype: torch.dtype
    sites: dict[str, SiteStats] = field(default_factory=dict)
    logits: torch.Tensor | None = None

    def add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach()
        finite = bool(torch.isfinite(value).all())
        magnitude = value.abs().float()
        magnitude = magnitude[torch.isfinite(magnitude)]
        max_abs = float(magnitude.max()) if magnitude.numel() else math.nan
        if name in self.sites:
            old = self.sites[name]
            self.sites[name] = SiteStats(max(old.max_abs, max_abs), old.finite and finite, old.order)
        else:
            self.sites[name] = SiteStats(max_abs, finite, len(self.sites))

    def first_nonfinite(self) -> str | None:
        bad = [(s.order, name) for name, s in self.sites.items() if not s.finite]
        return min(bad)[1] if bad else None


_SITE_OF = {"linear_attn.in_proj_qkv": "qkv", "linear_attn.in_proj_z": "z", "linear_attn.out_proj": "mixer_out",
            "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "mixer_out",
            "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down", "linear_attn.norm": "gdn_norm",
            "input_layernorm": "norm_in", "post_attention_layernorm": "norm_post"}


@contextlib.contextmanager
def _patched(module, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


@torch.no_grad()
def instrumented_forward(model, tokens: torch.Tensor, dtype: torch.dtype = torch.float32,
                         residual: str = "model") -> Record:
    """Run ``model`` (fp32 weights, left unchanged) in ``dtype`` on ``tokens`` and record every site.

    ``residual`` says where the residual stream lives: ``"model"`` — in ``dtype``, as transformers' Qwen3.5 does;
    ``"vllm"`` — in fp32 with fp16 sublayer outputs, as vLLM 0.19.1 / 0.20.2 do for Qwen3.5 in fp16 (GemmaRMSNorm
    with a residual adds ``x.float() + residual.float()`` and returns that fp32 sum as the new residual);
    ``"fp32-outputs"`` — also the residual-writing projections (out_proj, o_proj, down_proj) return their fp32
    accumulators unrounded, the model-override fix for a sublayer output beyond 65504."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    run = _copy_in(model, dtype)
    record = Record(dtype)
    text = _text(run)
    hooks = []

    def out_hook(name):
        return lambda _m, _a, out: record.add(name, out[0] if isinstance(out, tuple) else out)

    hooks.append(text.embed_tokens.register_forward_hook(out_hook("embed")))
    for i, layer in enumerate(text.layers):
        p = f"L{i}."
        for sub, site in _SITE_OF.items():
            try:
                module = layer.get_submodule(sub)
            except AttributeError:
                continue
            hooks.append(module.register_forward_hook(out_hook(p + site)))
        hooks.append(layer.mlp.down_proj.register_forward_pre_hook(
            lambda _m, args, p=p: record.add(p + "act", args[0])))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda _m, args, p=p: record.add(p + "resid_mid", args[0])))
        hooks.append(layer.register_forward_hook(out_hook(p + "resid")))
    hooks.append(text.norm.register_forward_hook(out_hook("final_norm")))
    if residual not in RESIDUAL_MODES:
        raise ValueError(f"residual must be one of {RESIDUAL_MODES}")
    if residual != "model":
        # the final norm reads the fp32 residual; lm_head wants the model dtype
        hooks.append(text.norm.register_forward_hook(lambda _m, _a, out: out.to(dtype)))

    layer_index = {id(layer): i for i, layer in enumerate(text.layers)}
    current = {"layer": 0}
    hooks += [layer.register_forward_pre_hook(lambda m, _a: current.update(layer=layer_index[id(m)]))
              for layer in text.layers]

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        p = f"L{current['layer']}."
        key_states = hf.repeat_kv(key, module.num_key_value_groups)
        raw = torch.matmul(query, key_states.transpose(2, 3))  # rounded to `dtype` here, as in eager attention
        record.add(p + "logits_qk", raw)
        record.add(p + "logits", raw * scaling)
        return hf.eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    chunk_rule = hf.torch_chunk_gated_delta_rule

    def gdn_rule(*args, **kwargs):
        kwargs["output_final_state"], wanted = True, kwargs.get("output_final_state", False)
        out, state = chunk_rule(*args, **kwargs)
        p = f"L{current['layer']}."
        record.add(p + "gdn_out", out)
        record.add(p + "gdn_state", state)
        return out, (state if wanted else None)

    def fp32_linear(module):
        return lambda x: torch.nn.functional.linear(x.float(), module.weight.float())

    def layer_forward(self, hidden_states, position_embeddings, attention_mask=None, position_ids=None,
                      past_key_values=None, **kwargs):
        residual = hidden_states.float()
        hidden_states = self.input_layernorm(residual).to(dtype)
        if self.block_type == "linear_attention":
            hidden_states = self.linear_attn(hidden_states=hidden_states, cache_params=past_key_values,
                                             attention_mask=attention_mask, **kwargs)
        else:
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                              position_ids=position_ids, past_key_values=past_key_values,
                                              position_embeddings=position_embeddings, **kwargs)
        residual = residual + hidden_states.float()
        hidden_states = self.post_attention_layernorm(residual).to(dtype)
        return residual + self.mlp(hidden_states).float()

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(hf, "torch_chunk_gated_delta_rule", gdn_rule))
        stack.enter_context(_patched(text.config, "_attn_implementation", "volta_fp16_probe"))
        stack.enter_context(_registered_attention(attention))
        if residual != "model":
            stack.enter_context(_patched(hf.Qwen3_5DecoderLayer, "forward", layer_forward))
        if residual == "fp32-outputs":
            for layer in text.layers:
                mixer = layer.linear_attn.out_proj if hasattr(layer, "linear_attn") else layer.self_attn.o_proj
                for module in (mixer, layer.mlp.down_proj):
                    stack.enter_context(_patched(module, "forward", fp32_linear(module)))
        try:
            logits = run(input_ids=tokens).logits
        finally:
            for handle in hooks:
                handle.remove()
    record.add("lm_logits", logits)
    record.logits = logits.float()
    return record


@contextlib.contextmanager
def _registered_attention(function):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS["volta_fp16_probe"] = function
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS["volta_fp16_probe"]


def _copy_in(model, dtype: torch.dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


# ─── the finding, as a table ──────────────────────────────────────────────────────────────────────────────────────
def controller(site: str) -> str:
    """Who computes a site when vLLM serves the model with this plugin (vLLM 0.19.1 / 0.20.2, fp16)."""
    name = site.split(".")[-1]
    if name in ("qkv", "z", "q", "k", "v", "mixer_out", "gate", "up", "down"):
        return "plugin: NVFP4 linear (every path), fp32 accumulate, fp16 output"
    if name in ("logits_qk", "logits"):
        return "plugin: attention kernel, fp32 logits"
    if name in ("gdn_out", "gdn_state", "gdn_norm"):
        return "plugin: GDN kernel, fp32 state (fp16 if the cache dtype is)"
    if name == "act":
        return "vLLM: SiluAndMul, fp16 output"
    if name in ("resid", "resid_mid"):
        return "vLLM: residual add in GemmaRMSNorm (fp32 in vLLM)"
    if name.startswith("norm") or name == "final_norm":
        return "vLLM: GemmaRMSNorm, fp32 math, fp16 output"
    return "vLLM"


def _cell(stats: SiteStats | None) -> str:
    if stats is None:
        return "—"
    return f"{stats.max_abs:.4g}" if stats.finite else "**inf/NaN**"


def overflow_table(reference: Record, runs: dict[str, Record], min_abs: float = 100.0) -> str:
    """Markdown rows: every site whose fp32 max |value| is ≥ ``min_abs`` or that is the first non-finite site of
    a run; columns: controller, fp32 max, each run's max (or inf/NaN)."""
    firsts = {run.first_nonfinite() for run in runs.values()} - {None}
    header = "| site | computed by | fp32 max abs | " + " | ".join(runs) + " |\n"
    header += "|---|---|---:|" + "---:|" * len(runs) + "\n"
    rows = []
    for site, stats in reference.sites.items():
        if stats.max_abs < min_abs and site not in firsts:
            continue
        mark = " ⚠" if stats.max_abs >= FP16_OVERFLOW else ""
        rows.append(f"| `{site}` | {controller(site)} | {stats.max_abs:.4g}{mark} | "
                    + " | ".join(_cell(run.sites.get(site)) for run in runs.values()) + " |")
    summary = "\n".join(f"- {name}: first non-finite site `{run.first_nonfinite()}`" if run.first_nonfinite()
                        else f"- {name}: all sites finite" for name, run in runs.items())
    return header + "\n".join(rows) + "\n\n" + summary + "\n"


LEVELS = {
    "bf16-typical (super activation 2e4, massive 3e4)": Stress(),
    "extreme (super activation 4e4, massive 1e5)": Stress(super_activation=4.0e4, super_weight=2.5),
}


def report(tokens: torch.Tensor | None = None) -> str:
    """The tables of benchmarks/results/fp16-overflow.md, for every stress level in LEVELS."""
    tokens = example_tokens() if tokens is None else tokens
    parts = []
    for title, stress in LEVELS.items():
        model = stress_weights(build_model(), stress, tokens)
        reference = instrumented_forward(model, tokens)
        runs = {"fp16 transformers (residual fp16)": instrumented_forward(model, tokens, torch.float16),
                "fp16 vLLM + plugin (residual fp32)": instrumented_forward(model, tokens, torch.float16,
                                                                           residual="vllm"),
                "+ fp32 outputs (override)": instrumented_forward(model, tokens, torch.float16,
                                                                  residual="fp32-outputs")}
        errors = ", ".join(f"{name}: {(run.logits - reference.logits).abs().max().item():.3g}"
                           for name, run in runs.items())
        parts.append(f"### {title}\n\n{overflow_table(reference, runs)}\nmax |logit − fp32 logit| "
                     f"(fp32 max |logit| {reference.logits.abs().max().item():.3g}): {errors}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(report())
