#!/usr/bin/env python3
"""Per-token budget of Qwen3.8-27B on one V100-32GB — a MODEL, not a measurement.

Bytes and FLOPs per kernel family (linear / attention / GDN / other) of one decode step at batch 1, 4, 8 and
context 512 … 8192, and of a 2048-token prefill, from the real shape (tests/data/qwen3.8-27b-config.json, read with
toolkit.planner), turned into time at the V100's 900 GB/s peak and 870 GB/s read practice and 125 TFLOP/s
(prefill: 99 TFLOP/s, cuBLAS practice). Each family costs max(memory time, compute time); the step is their sum.

Engines: volta_nvfp4 on compressed-tensors W4A16 (every decoder projection NVFP4 at 4.5 bit) and on ModelOpt mixed
(attention and GDN projections FP8, MLP NVFP4); fp16 (54 GB: does not fit a V100-32GB, so hypothetical); fp16 with
vLLM's CPU offload (the weights that do not fit 32 GB cross PCIe at 10-12 GB/s every forward). Embeddings and
lm_head are fp16 as real exports keep them; GDN in_proj_b/a stay fp16.

MTP speculation (K drafts, batch 1): a round is one verification forward of K + 1 tokens (weights read once, the
attention's KV once, the GDN state read once and written per token) plus K draft forwards of the MTP module, each
reading its layer, its fc and a full-vocabulary lm_head; against a plain decode step. The drafter's weights: 16-bit
as vLLM drafts (its 16-bit layers, the main model's fp16 head), or quantized by the plugin to FP8 (the default) or
NVFP4 — its 16-bit layers in place and a copy of the head (plugin/models/draft_weights.py); with the checkpoint's MTP
layer in 16 bits (as exports ship it) and in NVFP4 (then only the fc is the drafter's to quantize).

    python benchmarks/v100_budget.py [--out benchmarks/results/v100-budget-model.md]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devkit import v100  # noqa: E402
from vllm_volta_fp4.format.checkpoint import FP8, NVFP4, UNQUANTIZED  # noqa: E402
from vllm_volta_fp4.toolkit import planner  # noqa: E402

CONFIG = REPO / "tests" / "data" / "qwen3.8-27b-config.json"
BATCHES = (1, 4, 8)
CONTEXTS = (512, 1024, 2048, 4096, 8192)
PREFILL_TOKENS = 2048
FAMILIES = ("linear", "attention", "GDN", "other")
PREFILL_FAMILIES = (*FAMILIES, "dequantize")  # volta_nvfp4's large-M path: its own kernel before cuBLAS
FP16 = 2
GDN_FLOPS_PER_STATE_ELEMENT = 7  # decode: Sᵀk, rank-1 update, decay, Sᵀq (2 + 2 + 1 + 2 per element)
SEEDS_RIVAL = {"decode tok/s": 29, "prefill tok/s": 1100}  # published, one V100-32GB, plain (no speculation)


@dataclass(frozen=True)
class Engine:
    name: str
    kind_of: object  # (module name) -> NVFP4 / FP8 / UNQUANTIZED for decoder projections
    offload: bool = False
    dequantize_for_prefill: bool = False  # large-M calls dequantize to fp16 scratch, then cuBLAS


def _ct_w4a16(module: str) -> str:
    return UNQUANTIZED if module.endswith(("in_proj_a", "in_proj_b")) else NVFP4


def _modelopt_mixed(module: str) -> str:
    if module.endswith(("in_proj_a", "in_proj_b")):
        return UNQUANTIZED
    return FP8 if (".self_attn." in module or ".linear_attn." in module) else NVFP4


ENGINES = (Engine("volta_nvfp4, compressed-tensors W4A16", _ct_w4a16, dequantize_for_prefill=True),
           Engine("volta_nvfp4, ModelOpt mixed (FP8 attention/GDN projections)", _modelopt_mixed,
                  dequantize_for_prefill=True),
           Engine("fp16 (54 GB: hypothetical on a V100-32GB)", lambda module: UNQUANTIZED),
           Engine("fp16 + CPU offload to fit 32 GB", lambda module: UNQUANTIZED, offload=True))


@dataclass
class Cost:
    bytes: float = 0.0
    flops: float = 0.0

    def seconds(self, bandwidth: float, flops_per_s: float) -> float:
        return max(self.bytes / bandwidth, self.flops / flops_per_s)


@dataclass
class Step:
    """One forward: the cost per family, plus bytes that cross PCIe (CPU offload)."""

    families: dict[str, Cost] = field(default_factory=lambda: {family: Cost() for family in FAMILIES})
    pcie_bytes: float = 0.0

    def seconds(self, bandwidth: float, flops_per_s: float, pcie: float) -> float:
        return sum(c.seconds(bandwidth, flops_per_s) for c in self.families.values()) + self.pcie_bytes / pcie


def load_shape(path: Path = CONFIG) -> planner.ModelShape:
    config, where = planner.read_config(path)
    return planner.model_shape(config, where)


def weight_bytes(shape: planner.ModelShape, engine: Engine) -> tuple[float, float, float]:
    """(decoder projection bytes, lm_head bytes, embedding table bytes) as served."""
    decoder = head = embed = 0.0
    for module, rows, cols in planner.linear_shapes(shape):
        if "embed" in module:
            embed += rows * cols * FP16
        elif module == "lm_head":
            head += rows * cols * FP16
        else:
            decoder += planner._stored_bytes(engine.kind_of(module), rows, cols)
    return decoder, head, embed


def linear_params(shape: planner.ModelShape) -> tuple[int, int]:
    """(decoder projection parameters, lm_head parameters)."""
    decoder = sum(r * c for m, r, c in planner.linear_shapes(shape) if m != "lm_head" and "embed" not in m)
    head = shape.vocab * shape.hidden
    return decoder, head


def offloaded_bytes(shape: planner.ModelShape, engine: Engine, batch: int, max_model_len: int) -> float:
    """What vLLM's cpu_offload_gb must move to host memory so that weights + KV cache + GDN states + activations
    + fixed allowances fit 0.9 × 32 GB (planner's allowances)."""
    if not engine.offload:
        return 0.0
    decoder, head, embed = weight_bytes(shape, engine)
    small = planner._small_tensor_params(shape) * FP16
    resident_budget = (0.9 * v100.MEMORY_BYTES - batch * max_model_len * planner.kv_bytes_per_token(shape, 1)
                       - batch * planner.state_bytes_per_sequence(shape, 1) - planner.NON_TORCH_BYTES
                       - planner.CUDA_GRAPH_POOL_BYTES
                       - planner.activation_bytes(shape, planner.DEFAULT_BATCHED_TOKENS, batch, 1))
    return max(0.0, decoder + head + embed + small - resident_budget)


def kv_bytes_per_token(shape: planner.ModelShape) -> int:
    return shape.kv_heads * shape.head_dim * 2 * FP16  # K and V of one layer


def query_output_bytes(shape: planner.ModelShape) -> int:
    return shape.heads * shape.head_dim * 2 * FP16  # one token's query read and output written, one layer


def decode_seconds(step: Step) -> float:
    """A decode-like forward at the V100's read practice (870 GB/s), tensor peak and mid PCIe rate."""
    return step.seconds(v100.HBM_READ_BYTES_PER_S, v100.TENSOR_PEAK_FLOPS, sum(v100.PCIE_BYTES_PER_S) / 2)


def decode_step(shape: planner.ModelShape, engine: Engine, batch: int, context: int) -> Step:
    """One decode step of ``batch`` sequences at ``context`` tokens each (batch ≤ 8: weights read once)."""
    step = Step()
    decoder, head, _ = weight_bytes(shape, engine)
    decoder_params, head_params = linear_params(shape)
    h, i = shape.hidden, shape.intermediate
    layers = len(shape.layer_kinds)
    linear = step.families["linear"]
    activations_io = sum(r + c for m, r, c in planner.linear_shapes(shape) if "embed" not in m) * FP16 * batch
    linear.bytes = decoder + head + activations_io + batch * h * FP16  # + the embedding rows gathered
    linear.flops = 2 * batch * (decoder_params + head_params)
    attention = step.families["attention"]
    attention.bytes = shape.full_attention_layers * batch * (
        (context + 1) * kv_bytes_per_token(shape) + query_output_bytes(shape))
    attention.flops = shape.full_attention_layers * batch * 4 * shape.heads * shape.head_dim * context
    gdn_cost = step.families["GDN"]
    if shape.gdn is not None:
        gdn = shape.gdn
        state = gdn.num_value_heads * gdn.key_head_dim * gdn.value_head_dim
        conv_state = gdn.conv_dim * (gdn.conv_kernel - 1) * FP16
        per_seq = 2 * state * shape.ssm_state_bytes + 2 * conv_state + FP16 * (2 * gdn.conv_dim + 2 * gdn.value_dim)
        gdn_cost.bytes = shape.linear_attention_layers * batch * per_seq
        gdn_cost.flops = shape.linear_attention_layers * batch * GDN_FLOPS_PER_STATE_ELEMENT * state
    # norms, residual adds, SiLU·mul, rotary, sampling: read + write of ~8 hidden and 3 intermediate vectors a layer
    other = step.families["other"]
    other.bytes = layers * batch * FP16 * (8 * h + 3 * i) + batch * shape.vocab * 4 * 2
    other.flops = layers * batch * (10 * h + 4 * i)
    step.pcie_bytes = offloaded_bytes(shape, engine, batch, max(CONTEXTS))
    return step


def prefill_step(shape: planner.ModelShape, engine: Engine, tokens: int = PREFILL_TOKENS) -> Step:
    """One prefill of ``tokens`` prompt tokens (batch 1, one step), FLOP-bound."""
    step = Step()
    decoder, head, _ = weight_bytes(shape, engine)
    decoder_params, head_params = linear_params(shape)
    linear = step.families["linear"]
    linear.flops = 2 * tokens * decoder_params + 2 * head_params  # logits of the last token only
    activations = tokens * FP16 * sum(r + c for m, r, c in planner.linear_shapes(shape)
                                      if m != "lm_head" and "embed" not in m)
    linear.bytes = head + activations + (FP16 * decoder_params if engine.dequantize_for_prefill else decoder)
    if engine.dequantize_for_prefill:  # NVFP4/FP8 read, fp16 scratch written (then read by cuBLAS, above)
        step.families["dequantize"] = Cost(bytes=decoder + FP16 * decoder_params)
    attention = step.families["attention"]
    attention.flops = shape.full_attention_layers * 4 * shape.heads * shape.head_dim * tokens * tokens / 2
    attention.bytes = shape.full_attention_layers * tokens * FP16 * (
        2 * shape.kv_heads * shape.head_dim + 2 * shape.heads * shape.head_dim)
    gdn_cost = step.families["GDN"]
    if shape.gdn is not None:
        gdn, chunk = shape.gdn, planner.GDN_CHUNK
        d, dv = gdn.key_head_dim, gdn.value_head_dim
        # chunked delta rule per chunk and value head: K Kᵀ, Q Kᵀ, W, U (4 × C·C·d) and the state pass
        # ([W;Q] S₀ᵀ: 2C·dv·d, P Uᵀ: C·C·dv, Kᵀ U: d·C·dv) — multiply-adds, × 2 FLOP
        macs = 4 * chunk * chunk * d + 2 * chunk * dv * d + chunk * chunk * dv + d * chunk * dv
        gdn_cost.flops = shape.linear_attention_layers * gdn.num_value_heads * (tokens / chunk) * 2 * macs
        gdn_cost.bytes = shape.linear_attention_layers * tokens * FP16 * (3 * gdn.conv_dim + 4 * gdn.value_dim)
    other = step.families["other"]
    other.bytes = len(shape.layer_kinds) * tokens * FP16 * (8 * shape.hidden + 3 * shape.intermediate)
    other.flops = len(shape.layer_kinds) * tokens * (10 * shape.hidden + 4 * shape.intermediate)
    step.pcie_bytes = offloaded_bytes(shape, engine, 1, max(CONTEXTS))
    return step


def verify_step(shape: planner.ModelShape, engine: Engine, tokens: int, context: int) -> Step:
    """One speculative verification forward at batch 1: ``tokens`` = K + 1 query tokens of one sequence whose
    cache holds ``context`` tokens. Linear layers and the rest cost what a decode step of ``tokens`` sequences
    costs (weights read once, M ≤ 8); attention reads the one sequence's KV once; GDN reads the state once and
    writes one per token (vLLM keeps a state per verified token for the rollback)."""
    step = decode_step(shape, engine, tokens, context)
    step.families["attention"].bytes = shape.full_attention_layers * (
        (context + tokens) * kv_bytes_per_token(shape) + tokens * query_output_bytes(shape))
    if shape.gdn is not None:
        gdn = shape.gdn
        state = gdn.num_value_heads * gdn.key_head_dim * gdn.value_head_dim * shape.ssm_state_bytes
        step.families["GDN"].bytes = shape.linear_attention_layers * (
            (1 + tokens) * state + tokens * FP16 * (2 * gdn.conv_dim + 2 * gdn.value_dim))
    return step


def mtp_weight_bytes(shape: planner.ModelShape, quantized: bool, drafter: str | None = None) -> float:
    """The MTP module's matrices as served: the checkpoint's layer 16-bit (real exports exclude "*mtp*") or NVFP4
    (``quantized``), its fc 16-bit either way (ModelOpt keeps it so); the 16-bit ones in the ``drafter`` format
    (FP8 or NVFP4) where the plugin quantizes them, else 16-bit."""
    def served(module: str, rows: int, cols: int) -> float:
        if quantized and module != "mtp.fc":
            return planner._stored_bytes(NVFP4, rows, cols)
        return planner.drafter_stored_bytes(drafter, rows, cols) if drafter else rows * cols * FP16

    return sum(served(*matrix) for matrix in planner.mtp_linear_shapes(shape))


def draft_head_bytes(shape: planner.ModelShape, drafter: str | None) -> float:
    """The lm_head a draft reads: the fp16 head (None) or the plugin's copy in the ``drafter`` format."""
    return planner.draft_head_bytes(shape, drafter) if drafter else shape.vocab * shape.hidden * FP16


def draft_step(shape: planner.ModelShape, quantized: bool, context: int, drafter: str | None = None) -> Step:
    """One draft forward of the MTP module at batch 1: its layer(s) and fc, a full-vocabulary lm_head (draft_head_bytes)
    and an embedding row; attention over the MTP layer's own KV cache."""
    step = Step()
    h, i = shape.hidden, shape.intermediate
    mtp_params = sum(r * c for _, r, c in planner.mtp_linear_shapes(shape))
    linear = step.families["linear"]
    linear.bytes = mtp_weight_bytes(shape, quantized, drafter) + draft_head_bytes(shape, drafter) + h * FP16
    linear.flops = 2 * (mtp_params + shape.vocab * h)
    attention = step.families["attention"]
    attention.bytes = shape.mtp_layers * ((context + 1) * kv_bytes_per_token(shape) + query_output_bytes(shape))
    attention.flops = shape.mtp_layers * 4 * shape.heads * shape.head_dim * context
    other = step.families["other"]
    other.bytes = shape.mtp_layers * FP16 * (8 * h + 3 * i) + FP16 * 4 * h + shape.vocab * 4 * 2
    other.flops = shape.mtp_layers * (10 * h + 4 * i)
    return step


MTP_KS = range(1, 8)
MTP_CONTEXT = 2048
PUBLISHED_ACCEPTANCE = (2.8, 3.8)  # Qwen3.8 MTP at K = 3, the figures issue #16 quotes (tokens per round)


def mtp_round_rows(shape: planner.ModelShape, engine: Engine, quantized: bool,
                   drafter: str | None = None) -> list[dict]:
    """Per K: the round's time at 870 GB/s, its parts, its ratio to a plain decode step, and the acceptance
    length at which speculation breaks even (= that ratio: a round must yield as many tokens as it costs steps)."""
    plain = decode_seconds(decode_step(shape, engine, 1, MTP_CONTEXT))
    draft = decode_seconds(draft_step(shape, quantized, MTP_CONTEXT, drafter))
    rows = []
    for k in MTP_KS:
        verify = decode_seconds(verify_step(shape, engine, k + 1, MTP_CONTEXT))
        round_seconds = verify + k * draft
        rows.append({"k": k, "plain": plain, "verify": verify, "draft": draft, "round": round_seconds,
                     "ratio": round_seconds / plain})
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def report(shape: planner.ModelShape) -> str:
    pcie_low, pcie_high = v100.PCIE_BYTES_PER_S
    lines = [
        "# Qwen3.8-27B on one V100-32GB: per-token budget — a MODEL, not a measurement",
        "",
        "Written by `benchmarks/v100_budget.py` from `tests/data/qwen3.8-27b-config.json` (toolkit.planner's "
        f"shape reading): {len(shape.layer_kinds)} layers = {shape.linear_attention_layers} Gated DeltaNet + "
        f"{shape.full_attention_layers} gated full attention, hidden {shape.hidden}, intermediate "
        f"{shape.intermediate}, vocabulary {shape.vocab}, KV {shape.kv_heads} × {shape.head_dim}, GDN state "
        f"{shape.gdn.num_value_heads} × {shape.gdn.key_head_dim} × {shape.gdn.value_head_dim} at "
        f"{shape.ssm_state_bytes} bytes. No V100 ran anything here.",
        "",
        "Each family costs max(bytes / bandwidth, FLOPs / peak); a step is the sum over families plus the bytes "
        f"that cross PCIe. Decode: {v100.HBM_PEAK_BYTES_PER_S / 1e9:.0f} GB/s peak and "
        f"{v100.HBM_READ_BYTES_PER_S / 1e9:.0f} GB/s read practice, {v100.TENSOR_PEAK_FLOPS / 1e12:.0f} TFLOP/s; "
        f"CPU offload at {pcie_low / 1e9:.0f}-{pcie_high / 1e9:.0f} GB/s. These are ceilings: no launch gaps, "
        "no kernel below its roofline (the project's kernels reach 47-95 % of copy bandwidth on the H200). CPU "
        "offload: the engine is sized for the row's batch at max-model-len 8192; what does not fit 0.9 × 32 GB "
        "(after KV cache, GDN states, activations and planner's allowances) is offloaded. GDN states at 2 bytes "
        "(the config sets no mamba_ssm_dtype); an fp32 state doubles the GDN column.",
        "",
        "## Weights as served",
        "",
        "| engine | decoder projections GB | lm_head GB | embeddings GB | offloaded to host GB (batch 8, 8192) |",
        "|---|---:|---:|---:|---:|",
    ]
    for engine in ENGINES:
        decoder, head, embed = weight_bytes(shape, engine)
        lines.append(f"| {engine.name} | {decoder / 1e9:.2f} | {head / 1e9:.2f} | {embed / 1e9:.2f} | "
                     f"{offloaded_bytes(shape, engine, 8, max(CONTEXTS)) / 1e9:.2f} |")
    lines += ["", "## Decode: one step (one token per sequence)", "",
              "| engine | batch | context | " + " | ".join(f"{f} MB" for f in FAMILIES) + " | PCIe MB | "
              + " | ".join(f"{f} ms @870" for f in FAMILIES) + " | step ms @900 | step ms @870 | tok/s @870 |",
              "|---|---:|---:|" + "---:|" * (2 * len(FAMILIES) + 4)]
    for engine in ENGINES:
        for batch in BATCHES:
            for context in CONTEXTS:
                step = decode_step(shape, engine, batch, context)
                read = v100.HBM_READ_BYTES_PER_S
                at_870 = decode_seconds(step)
                at_900 = step.seconds(v100.HBM_PEAK_BYTES_PER_S, v100.TENSOR_PEAK_FLOPS, sum(v100.PCIE_BYTES_PER_S) / 2)
                lines.append(
                    f"| {engine.name} | {batch} | {context} | "
                    + " | ".join(f"{step.families[f].bytes / 1e6:.0f}" for f in FAMILIES)
                    + f" | {step.pcie_bytes / 1e6:.0f} | "
                    + " | ".join(_ms(step.families[f].seconds(read, v100.TENSOR_PEAK_FLOPS)) for f in FAMILIES)
                    + f" | {_ms(at_900)} | {_ms(at_870)} | {batch / at_870:.1f} |")
    lines += ["", f"## Prefill: {PREFILL_TOKENS} prompt tokens, batch 1, one step (FLOP-bound at "
              f"{v100.CUBLAS_FP16_FLOPS / 1e12:.0f} TFLOP/s, cuBLAS fp16 practice)", "",
              "| engine | " + " | ".join(f"{f} TFLOP" for f in FAMILIES) + " | linear GB | PCIe GB | "
              + " | ".join(f"{f} ms" for f in PREFILL_FAMILIES) + " | step ms | prefill tok/s |",
              "|---|" + "---:|" * (len(FAMILIES) + len(PREFILL_FAMILIES) + 4)]
    prefill = {}
    for engine in ENGINES:
        step = prefill_step(shape, engine)
        seconds = step.seconds(v100.HBM_READ_BYTES_PER_S, v100.CUBLAS_FP16_FLOPS, sum(v100.PCIE_BYTES_PER_S) / 2)
        prefill[engine.name] = PREFILL_TOKENS / seconds
        lines.append(f"| {engine.name} | " + " | ".join(f"{step.families[f].flops / 1e12:.2f}" for f in FAMILIES)
                     + f" | {step.families['linear'].bytes / 1e9:.1f} | {step.pcie_bytes / 1e9:.1f} | "
                     + " | ".join(_ms(step.families.get(f, Cost()).seconds(v100.HBM_READ_BYTES_PER_S,
                                                                          v100.CUBLAS_FP16_FLOPS))
                                  for f in PREFILL_FAMILIES) + f" | {_ms(seconds)} | {PREFILL_TOKENS / seconds:.0f} |")
    nvfp4, offload = ENGINES[0], ENGINES[3]
    decode_nvfp4 = 1 / decode_seconds(decode_step(shape, nvfp4, 1, 512))
    decode_offload = 1 / decode_seconds(decode_step(shape, offload, 1, 512))
    lines += [
        "",
        "## Against the seeds' published numbers (one V100-32GB, plain decoding)",
        "",
        f"- Decode, batch 1, 512 tokens of context: the model's ceiling for volta_nvfp4 (W4A16) is "
        f"{decode_nvfp4:.1f} tok/s against the rival's {SEEDS_RIVAL['decode tok/s']} tok/s measured, i.e. the rival "
        f"runs at {100 * SEEDS_RIVAL['decode tok/s'] / decode_nvfp4:.0f} % of this roofline. The fp16 lm_head "
        "alone (2.5 GB, read every step) is ~2.9 ms of the step; a quantized lm_head would lift the ceiling.",
        f"- fp16 + CPU offload: {decode_offload:.2f} tok/s — the offloaded weights cross PCIe every step, so the "
        "seeds' '≥ 3× fp16 + offload' decode claim is met by a wide margin if the offload works as modelled.",
        f"- Prefill at {PREFILL_TOKENS}: volta_nvfp4 (W4A16) {prefill[nvfp4.name]:.0f} tok/s modelled (dequantize + "
        f"cuBLAS) against the rival's ~{SEEDS_RIVAL['prefill tok/s']} tok/s; fp16 + offload "
        f"{prefill[offload.name]:.0f} tok/s (its {offloaded_bytes(shape, offload, 1, max(CONTEXTS)) / 1e9:.0f} GB "
        "cross PCIe once per forward).",
        "",
    ]
    return "\n".join(lines + mtp_report(shape))


DRAFTERS = {None: "16-bit (vLLM)", FP8: "FP8 (default)", NVFP4: "NVFP4"}


def mtp_report(shape: planner.ModelShape) -> list[str]:
    if not shape.mtp_layers:
        return []
    nvfp4 = ENGINES[0]
    layer = ", ".join(f"{name} {mtp_weight_bytes(shape, False, fmt) / 1e9:.2f} GB" for fmt, name in DRAFTERS.items())
    heads = ", ".join(f"{name} {draft_head_bytes(shape, fmt) / 1e9:.2f} GB" for fmt, name in DRAFTERS.items())
    lines = [f"## MTP speculation: one round at batch 1, context {MTP_CONTEXT}, {nvfp4.name}", "",
             f"MTP module: {shape.mtp_layers} full-attention layer(s) + fc, 16-bit as exports ship it; served by "
             f"the drafter's format: {layer} (an NVFP4 layer in the checkpoint: "
             f"{mtp_weight_bytes(shape, True) / 1e9:.2f} GB with a 16-bit fc). Every draft also scores the full "
             f"vocabulary: with the main model's fp16 lm_head (as vLLM drafts) or with the plugin's copy of it in the "
             f"drafter's format (verification keeps the fp16 head) — {heads}. Break-even = the acceptance length "
             "(tokens per round) at which a round pays for itself; tok/s at the published Qwen3.8 acceptance "
             f"lengths {' and '.join(map(str, PUBLISHED_ACCEPTANCE))} (K = 3; shown where ≤ K + 1), as if the "
             "quantized drafter accepted as many drafts as the 16-bit one.", "",
             "| drafter's weights | checkpoint's MTP layer | K | verify ms | draft ms (each) | round ms | × plain step "
             "= break-even acceptance | " + " | ".join(f"tok/s at {a}" for a in PUBLISHED_ACCEPTANCE) + " |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(PUBLISHED_ACCEPTANCE)]
    rows = {(fmt, quantized): mtp_round_rows(shape, nvfp4, quantized, fmt)
            for fmt in DRAFTERS for quantized in (False, True)}
    for (fmt, quantized), rows_of_format in rows.items():
        for row in rows_of_format:
            rates = [f"{a / row['round']:.1f}" if a <= row["k"] + 1 else "—" for a in PUBLISHED_ACCEPTANCE]
            lines.append(f"| {DRAFTERS[fmt]} | {'NVFP4' if quantized else '16-bit'} | {row['k']} | "
                         f"{_ms(row['verify'])} | {_ms(row['draft'])} | {_ms(row['round'])} | {row['ratio']:.2f} | "
                         + " | ".join(rates) + " |")
    plain = rows[(None, False)][0]["plain"]
    k3 = "; ".join(f"{DRAFTERS[fmt]} {rows[(fmt, False)][2]['ratio']:.3f}× ({rows[(fmt, True)][2]['ratio']:.3f}× "
                   "with an NVFP4 MTP layer in the checkpoint)" for fmt in DRAFTERS)
    reads = ", ".join(f"{DRAFTERS[fmt]} {draft_step_ms(shape, fmt):.2f} ms" for fmt in DRAFTERS)
    lines += ["", f"Plain step: {_ms(plain)} ms ({1 / plain:.1f} tok/s). A K = 3 round with the 16-bit MTP layer "
              f"of real exports costs, by the drafter's weights: {k3} (issue #16's goal: ≤ 1.3×). One draft: {reads}.",
              ""]
    return lines


def draft_step_ms(shape: planner.ModelShape, drafter: str | None) -> float:
    return decode_seconds(draft_step(shape, False, MTP_CONTEXT, drafter)) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "v100-budget-model.md")
    args = parser.parse_args()
    text = report(load_shape())
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
