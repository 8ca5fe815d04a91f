"""The NVFP4 / E4M3 codecs over every code, rounding at every tie, and quantization error bounds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_volta_fp4.format.nvfp4 import (
    E2M1_VALUES,
    E4M3_VALUES,
    decode_e2m1,
    decode_e4m3,
    dequantize_fp8,
    dequantize_nvfp4,
    encode_e2m1,
    encode_e4m3,
    fp8_linear_reference,
    nvfp4_linear_reference,
    pack_e2m1,
    quantize_fp8,
    quantize_nvfp4,
    unpack_e2m1,
)

# The E2M1 value set as the OCP MX / NVFP4 specification lists it, code 0..7 (bit 3 is the sign).
SPEC_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_table_matches_the_specification_for_all_16_codes():
    for code in range(16):
        expected = SPEC_E2M1[code & 7] * (-1.0 if code & 8 else 1.0)
        value = decode_e2m1(torch.tensor([code], dtype=torch.uint8)).item()
        assert value == expected and math.copysign(1, value) == (-1 if code & 8 else 1), code


def test_e2m1_encode_inverts_decode_for_all_16_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_e2m1(decode_e2m1(codes)), codes)


@pytest.mark.parametrize(
    ("value", "expected"),
    # every midpoint between neighbours goes to the even code: 0.25→0, 0.75→1.0, 1.25→1.0, 1.75→2, 2.5→2, 3.5→4, 5→4
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
     (0.2500001, 0.5), (4.9999, 4.0), (5.0001, 6.0), (6.5, 6.0), (1e30, 6.0), (float("inf"), 6.0)],
)
def test_e2m1_rounds_half_to_even_and_saturates(value, expected):
    for sign in (1.0, -1.0):
        code = encode_e2m1(torch.tensor([sign * value]))
        assert decode_e2m1(code).item() == sign * expected


def test_e2m1_keeps_the_sign_of_values_that_round_to_zero():
    assert encode_e2m1(torch.tensor([-0.1, -0.0, 0.1, 0.0])).tolist() == [8, 8, 0, 0]


def test_e2m1_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        encode_e2m1(torch.tensor([1.0, float("nan")]))


def test_e4m3_table_matches_torch_for_all_256_codes():
    torch_values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    nan = torch.isnan(torch_values)
    assert torch.equal(nan, torch.isnan(E4M3_VALUES))
    assert nan.nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert torch.equal(E4M3_VALUES[~nan], torch_values[~nan])
    assert E4M3_VALUES[0x7E].item() == 448.0 and E4M3_VALUES[0x01].item() == 2.0**-9


def test_e4m3_encode_inverts_decode_for_all_finite_codes():
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    assert torch.equal(encode_e4m3(decode_e4m3(codes)), codes)


def test_e4m3_encode_agrees_with_torch_at_every_midpoint_and_on_random_values():
    finite = E4M3_VALUES[:0x7F]
    midpoints = (finite[1:] + finite[:-1]) / 2
    generator = torch.Generator().manual_seed(1)
    random = torch.randn(100_000, generator=generator) * torch.logspace(-4, 2.6, 100_000)
    values = torch.cat([midpoints, -midpoints, random]).clamp(-448, 448)
    assert torch.equal(encode_e4m3(values), values.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_saturates_and_maps_nan_to_the_nan_code():
    encoded = encode_e4m3(torch.tensor([500.0, -1e9, float("inf"), float("nan")])).tolist()
    assert encoded == [0x7E, 0xFE, 0x7E, 0x7F]


def test_pack_puts_the_even_element_in_the_low_nibble():
    packed = pack_e2m1(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8))
    assert packed.tolist() == [[0x21, 0x0F]]


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 8), half_cols=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(rows, half_cols, seed):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, half_cols * 2), generator=generator, dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.shape == (rows, half_cols) and packed.dtype == torch.uint8
    assert torch.equal(unpack_e2m1(packed), codes)


def _nvfp4_error_bound(quantized, weight):
    """Elementwise bound: half the widest E2M1 gap (1.0) in units of the block's effective scale, or, where the
    block scale underflowed E4M3, the block's own magnitude (< 6 · 2^-10 · global scale)."""
    rows, cols = weight.shape
    effective = decode_e4m3(quantized.block_scale) * quantized.global_scale
    effective = effective.repeat_interleave(16, dim=1).reshape(rows, cols)
    return torch.maximum(effective, torch.full_like(effective, 6 * 2**-10 * float(quantized.global_scale)))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), blocks=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       log_spread=st.floats(0, 12))
def test_quantize_dequantize_error_is_bounded(rows, blocks, seed, log_spread):
    generator = torch.Generator().manual_seed(seed)
    # per-block magnitudes spread over 2^log_spread so tiny blocks reach E4M3's subnormal range
    magnitude = torch.exp2(-torch.rand(rows, blocks, 1, generator=generator) * log_spread)
    weight = (torch.randn(rows, blocks, 16, generator=generator) * magnitude).reshape(rows, blocks * 16)
    quantized = quantize_nvfp4(weight)
    restored = dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale)
    assert torch.isfinite(restored).all()
    assert ((restored - weight).abs() <= _nvfp4_error_bound(quantized, weight) * (1 + 1e-6)).all()


def test_quantize_uses_nvidias_global_scale_and_reproduces_representable_weights():
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (32, 64), generator=generator, dtype=torch.uint8)
    codes[:, 0] = 7  # every block reaches ±6, so the block scale is exactly 1 in units of the global scale
    codes[:, 16::16] = 7
    weight = decode_e2m1(codes) * (448 * 2**-10)  # amax 6·448·2^-10, so the decode scale amax/(6·448) is exact
    quantized = quantize_nvfp4(weight)
    assert float(quantized.global_scale) == 2**-10
    assert torch.equal(dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale), weight)


def test_gaussian_weights_lose_about_a_tenth_of_their_norm():
    weight = torch.randn(256, 512, generator=torch.Generator().manual_seed(4))
    quantized = quantize_nvfp4(weight)
    restored = dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale)
    relative = float((restored - weight).norm() / weight.norm())
    assert 0.05 < relative < 0.13


def test_per_row_global_scales_apply_to_their_own_rows():
    generator = torch.Generator().manual_seed(5)
    top, bottom = torch.randn(8, 32, generator=generator), 40 * torch.randn(4, 32, generator=generator)
    q_top, q_bottom = quantize_nvfp4(top), quantize_nvfp4(bottom)
    merged = dequantize_nvfp4(torch.cat([q_top.packed, q_bottom.packed]),
                              torch.cat([q_top.block_scale, q_bottom.block_scale]),
                              torch.cat([q_top.global_scale.expand(8), q_bottom.global_scale.expand(4)]))
    separate = torch.cat([dequantize_nvfp4(q.packed, q.block_scale, q.global_scale) for q in (q_top, q_bottom)])
    assert torch.equal(merged, separate)


def test_dequantize_rejects_mismatched_block_scales():
    quantized = quantize_nvfp4(torch.randn(4, 32))
    with pytest.raises(ValueError, match="block_scale shape"):
        dequantize_nvfp4(quantized.packed, quantized.block_scale[:, :1], quantized.global_scale)


def test_quantize_rejects_k_not_multiple_of_16_and_non_finite_weights():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_nvfp4(torch.tensor([[float("inf")] + [0.0] * 15]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dequantize_to_fp16_is_the_rounded_fp32_result(dtype):
    quantized = quantize_nvfp4(torch.randn(16, 48, generator=torch.Generator().manual_seed(6)))
    wide = dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale)
    assert torch.equal(dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale, dtype),
                       wide.to(dtype))


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_weights_round_trip_within_e4m3_precision(per_channel):
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(7)) * torch.linspace(0.1, 10, 24)[:, None]
    fp8, scale = quantize_fp8(weight, per_channel=per_channel)
    assert fp8.dtype == torch.float8_e4m3fn and scale.shape == ((24,) if per_channel else ())
    restored = dequantize_fp8(fp8, scale)
    bound = weight.abs() * 2**-4 + (scale[:, None] if per_channel else scale) * 2**-10
    assert ((restored - weight).abs() <= bound).all()


@pytest.mark.parametrize("with_bias", [False, True])
def test_reference_linears_match_float64_matmul(with_bias):
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(5, 64, generator=generator)
    bias = torch.randn(48, generator=generator) if with_bias else None
    quantized = quantize_nvfp4(torch.randn(48, 64, generator=generator))
    weight = dequantize_nvfp4(quantized.packed, quantized.block_scale, quantized.global_scale).double()
    expected = x.double() @ weight.T + (bias.double() if with_bias else 0)
    got = nvfp4_linear_reference(x, quantized.packed, quantized.block_scale, quantized.global_scale, bias)
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-5)
    fp8, scale = quantize_fp8(torch.randn(48, 64, generator=generator))
    expected = x.double() @ dequantize_fp8(fp8, scale).double().T + (bias.double() if with_bias else 0)
    assert torch.allclose(fp8_linear_reference(x, fp8, scale, bias).double(), expected, rtol=1e-5, atol=1e-5)


def test_e2m1_values_table_is_ordered_by_code():
    assert E2M1_VALUES[:8].tolist() == SPEC_E2M1
