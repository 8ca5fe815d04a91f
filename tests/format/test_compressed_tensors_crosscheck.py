"""Against a producer nobody here wrote: the compressed-tensors library's own NVFP4 quantize / pack / unpack."""

from __future__ import annotations

import pytest
import torch

from vllm_volta_fp4.format.nvfp4 import (
    BLOCK_SIZE,
    decode_e2m1,
    decode_e4m3,
    dequantize_nvfp4,
    encode_e2m1,
    pack_e2m1,
    quantize_nvfp4,
    unpack_e2m1,
)

ct_helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.quantization import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.quant_args import FP4_E2M1_DATA  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402


def _their_compression(weight: torch.Tensor, global_encode_scale: torch.Tensor | None = None):
    """compressed-tensors' NVFP4A16 path: global scale, fp8 block scales, then its compressor."""
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    if global_encode_scale is None:
        global_encode_scale = generate_gparam(weight.min(), weight.max())
    rows, cols = weight.shape
    blocks = weight.reshape(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights, global_scale=global_encode_scale)
    state = NVFP4PackedCompressor.compress(
        {"weight": weight, "weight_scale": scale, "weight_global_scale": global_encode_scale}, scheme)
    return state, scheme


def _weight(rows=96, cols=320, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=generator) * torch.logspace(-2, 1, rows)[:, None]


def test_their_fp4_rounding_and_packing_equal_ours_on_every_tie():
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    ties = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([grid, ties, ties + 1e-3, ties - 1e-3, torch.tensor([7.0, 100.0])])
    values = torch.cat([values, -values, torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 3])
    values = values[: values.numel() // 2 * 2].reshape(1, -1)
    values = torch.where(values == 0, 0.0, values)  # exact -0.0 is the one input the two treat differently (below)
    theirs = ct_helpers.pack_fp4_to_uint8(FP4_E2M1_DATA.cast_to_fp4(values.clone()))
    assert torch.equal(pack_e2m1(encode_e2m1(values)), theirs)


def test_exact_negative_zero_is_the_only_sign_difference_and_decodes_to_zero_either_way():
    values = torch.tensor([[-0.0, -0.1]])
    theirs = unpack_e2m1(ct_helpers.pack_fp4_to_uint8(FP4_E2M1_DATA.cast_to_fp4(values.clone())))
    ours = encode_e2m1(values)
    assert theirs.tolist() == [[0, 8]] and ours.tolist() == [[8, 8]]  # we keep the sign, as the hardware does
    assert decode_e2m1(theirs).abs().sum() == 0 and decode_e2m1(ours).abs().sum() == 0


def test_their_packed_tensors_decode_bit_exactly_with_ours():
    weight = _weight()
    state, _ = _their_compression(weight)
    packed, block_scale = state["weight_packed"], state["weight_scale"]
    assert packed.dtype == torch.uint8 and block_scale.dtype == torch.float8_e4m3fn
    rows, half_cols = packed.shape
    their_values = ct_helpers.unpack_fp4_from_uint8(packed, rows, half_cols * 2, dtype=torch.float32)
    assert torch.equal(decode_e2m1(unpack_e2m1(packed)), their_values)
    assert torch.equal(decode_e4m3(block_scale), block_scale.to(torch.float32))


def test_their_dequantization_matches_ours_to_the_last_bit_of_float32_order():
    """compressed-tensors stores the *encode* global scale; decoding with its inverse gives their weights.
    The products are formed in a different order (they divide by the encode scale), so allow one float32 ulp."""
    weight = _weight(seed=2)
    state, scheme = _their_compression(weight)
    their_dense = NVFP4PackedCompressor.decompress(
        {**state, "weight_scale": state["weight_scale"]}, scheme)["weight"].to(torch.float32)
    ours = dequantize_nvfp4(state["weight_packed"], state["weight_scale"], 1.0 / state["weight_global_scale"])
    ulp = torch.finfo(torch.float32).eps * ours.abs()
    # their decompress works in bfloat16 by default; compare at bfloat16 precision where they round
    assert torch.allclose(ours.to(torch.bfloat16).float(), their_dense, rtol=2**-7, atol=0)
    assert (ours - their_dense).abs().max() <= (their_dense.abs() * 2**-7).max() + ulp.max()


def test_our_quantizer_produces_their_bytes_from_the_same_inputs_and_scales():
    """With a power-of-two global scale both recipes compute the same scaled values exactly, so every packed
    byte and every block scale must agree."""
    weight = _weight(seed=3)
    encode = torch.exp2(torch.round(torch.log2(generate_gparam(weight.min(), weight.max()))))
    state, _ = _their_compression(weight, encode)
    ours = quantize_nvfp4(weight, global_scale=1.0 / encode)
    assert torch.equal(ours.block_scale.view(torch.uint8), state["weight_scale"].view(torch.uint8))
    assert torch.equal(ours.packed, state["weight_packed"])


def test_our_quantizer_with_their_natural_global_scale_differs_only_at_rounding_ties():
    """With amax-derived scales the recipes differ in float order (x/(s/g) vs x/(s·(1/g))): codes may differ at
    an exact E2M1 tie only, i.e. by one step, and almost never."""
    weight = _weight(seed=4)
    state, _ = _their_compression(weight)
    ours = quantize_nvfp4(weight, global_scale=1.0 / state["weight_global_scale"].reshape(()))
    assert torch.equal(ours.block_scale.view(torch.uint8), state["weight_scale"].view(torch.uint8))
    our_values, their_values = (decode_e2m1(unpack_e2m1(p)) for p in (ours.packed, state["weight_packed"]))
    differ = our_values != their_values
    assert differ.float().mean() < 1e-3
    steps = (our_values[differ] - their_values[differ]).abs()
    assert (steps <= 2.0).all()
