"""The V100 per-token budget model's arithmetic (benchmarks/v100_budget.py) on a tiny hybrid shape."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from vllm_volta_fp4.toolkit import planner

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "v100_budget.py"
_spec = importlib.util.spec_from_file_location("v100_budget", _PATH)
budget = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = budget
_spec.loader.exec_module(budget)

TINY = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "attn_output_gate": True, "vocab_size": 1000,
    "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "model_type": "qwen3_5_text"}}
W4A16, MIXED, FP16, OFFLOAD = budget.ENGINES


@pytest.fixture(scope="module")
def shape():
    return planner.model_shape(TINY, Path("tiny"))


def test_weights_at_4_5_bits_and_fp16_head(shape):
    decoder, head, embed = budget.weight_bytes(shape, W4A16)
    params = {m: r * c for m, r, c in planner.linear_shapes(shape)}
    quantized = sum(p for m, p in params.items() if "embed" not in m and m != "lm_head"
                    and not m.endswith(("in_proj_a", "in_proj_b")))
    small = sum(p for m, p in params.items() if m.endswith(("in_proj_a", "in_proj_b")))
    modules = sum(1 for m in params if "embed" not in m and m != "lm_head" and not m.endswith(("_a", "_b")))
    assert decoder == quantized * 4.5 / 8 + 4 * modules + 2 * small  # + one fp32 global scale per tensor
    assert head == embed == 1000 * 64 * 2
    assert budget.weight_bytes(shape, FP16)[0] == 2 * (quantized + small)
    assert budget.weight_bytes(shape, W4A16)[0] < budget.weight_bytes(shape, MIXED)[0]  # FP8 attention/GDN


def test_decode_step_bytes(shape):
    step = budget.decode_step(shape, W4A16, batch=2, context=100)
    kv_per_token = 2 * 16 * 2 * 2  # K and V, 2 heads × 16, fp16
    assert step.families["attention"].bytes == 1 * 2 * (101 * kv_per_token + 4 * 16 * 2 * 2)
    state = 4 * 16 * 16 * 2  # value heads × dk × dv × fp16
    assert step.families["GDN"].bytes > 3 * 2 * 2 * state
    decoder, head, _ = budget.weight_bytes(shape, W4A16)
    assert step.families["linear"].bytes > decoder + head
    assert step.pcie_bytes == 0  # the tiny model fits without offload


def test_time_is_the_sum_of_family_rooflines(shape):
    step = budget.Step()
    step.families["linear"] = budget.Cost(bytes=870e6, flops=1e9)  # 1 ms of memory, 8 µs of compute
    step.families["attention"] = budget.Cost(bytes=0, flops=125e9)  # 1 ms of compute
    step.pcie_bytes = 11e6  # 1 ms at 11 GB/s
    assert step.seconds(870e9, 125e12, 11e9) == pytest.approx(3e-3)


def test_prefill_dequantizes_for_volta_nvfp4_only(shape):
    assert "dequantize" in budget.prefill_step(shape, W4A16, 256).families
    assert "dequantize" not in budget.prefill_step(shape, FP16, 256).families


@pytest.fixture(scope="module")
def mtp_shape():
    config = {**TINY, "text_config": {**TINY["text_config"], "mtp_num_hidden_layers": 1}}
    return planner.model_shape(config, Path("tiny-mtp"))


def test_verification_reads_weights_once_and_kv_once(mtp_shape):
    one, four = (budget.verify_step(mtp_shape, W4A16, tokens, context=100) for tokens in (1, 4))
    # linear: weights once; only the activations (inputs and outputs of every matrix, the embedding row) per token
    per_token = 2 * sum(r + c for m, r, c in planner.linear_shapes(mtp_shape) if "embed" not in m) + 2 * 64
    assert four.families["linear"].bytes - one.families["linear"].bytes == 3 * per_token
    kv_per_token, q_out = 2 * 16 * 2 * 2, 4 * 16 * 2 * 2
    assert four.families["attention"].bytes == (104 * kv_per_token + 4 * q_out)  # one attention layer, KV once
    state = 4 * 16 * 16 * 2
    assert four.families["GDN"].bytes == 3 * (5 * state + 4 * 2 * (2 * (2 * 16 + 2 * 16 + 4 * 16) + 2 * 4 * 16))


def test_a_draft_reads_the_mtp_layer_and_the_lm_head_in_the_drafters_format(mtp_shape):
    matrices = planner.mtp_linear_shapes(mtp_shape)
    mtp_params = sum(r * c for _, r, c in matrices)
    fc = 64 * 128
    assert budget.mtp_weight_bytes(mtp_shape, quantized=False) == 2 * mtp_params
    assert budget.mtp_weight_bytes(mtp_shape, quantized=True) < 2 * mtp_params / 2  # 4.5 bits but the fc
    assert budget.mtp_weight_bytes(mtp_shape, quantized=True) > 2 * fc
    draft = budget.draft_step(mtp_shape, quantized=False, context=100)
    assert draft.families["linear"].bytes == 2 * mtp_params + 2 * 1000 * 64 + 2 * 64
    # the plugin's drafter: its 16-bit layers and a copy of the head at a byte (FP8) or 4.5 bits (NVFP4) per weight,
    # a float32 scale per row
    rows = sum(r for _, r, _ in matrices)
    fp8 = budget.draft_step(mtp_shape, quantized=False, context=100, drafter="fp8")
    fp8_layers = mtp_params + 4 * len(matrices) + 4 * rows
    assert fp8.families["linear"].bytes == fp8_layers + (1000 * 64 + 4 + 4 * 1000) + 2 * 64
    nvfp4 = budget.draft_step(mtp_shape, quantized=False, context=100, drafter="nvfp4")
    nvfp4_layers = sum(r * c * 9 // 16 + 4 + 4 * r for _, r, c in matrices)
    assert nvfp4.families["linear"].bytes == nvfp4_layers + (1000 * 64 * 9 // 16 + 4 + 4 * 1000) + 2 * 64
    # an NVFP4 layer in the checkpoint: the drafter quantizes only its 16-bit fc
    assert (budget.mtp_weight_bytes(mtp_shape, quantized=True) - budget.mtp_weight_bytes(mtp_shape, True, "fp8")
            == 2 * fc - (fc + 4 + 4 * 64))


def test_round_is_verification_plus_k_drafts(mtp_shape):
    rows = budget.mtp_round_rows(mtp_shape, W4A16, quantized=False)
    assert [row["k"] for row in rows] == list(budget.MTP_KS)
    for row in rows:
        assert row["round"] == pytest.approx(row["verify"] + row["k"] * row["draft"])
        assert row["ratio"] == pytest.approx(row["round"] / row["plain"]) and row["ratio"] > 1
    assert all(later["round"] > earlier["round"] for earlier, later in zip(rows, rows[1:], strict=False))
    fp8, nvfp4 = (budget.mtp_round_rows(mtp_shape, W4A16, quantized=False, drafter=fmt) for fmt in ("fp8", "nvfp4"))
    assert all(a["round"] < b["round"] < c["round"] for a, b, c in zip(nvfp4, fp8, rows, strict=True))
    report = "\n".join(budget.mtp_report(mtp_shape))
    assert "| 16-bit (vLLM) | 16-bit | 3 |" in report and "| FP8 (default) | 16-bit | 3 |" in report
    assert "| NVFP4 | NVFP4 | 3 |" in report
