"""The NVFP4 and FP8-E4M3 weight formats, as plain torch (CPU or CUDA). No vLLM import.

NVFP4 stores a weight W[N, K] as
  * ``packed``      uint8  [N, K/2]   two E2M1 codes per byte, the *low* nibble holds the even column;
  * ``block_scale`` float8_e4m3fn [N, K/16]  one scale per 16 consecutive input elements;
  * ``global_scale`` float32, the *decode* scale (amax / (6 * 448)); a scalar, or one value per output row so
    that merged layers (q/k/v, gate/up) keep each shard's own scale exactly.
and ``W = e2m1(code) * float(block_scale) * global_scale``.

Every codec here is exact and table driven: E2M1 has 16 codes, E4M3 has 256, and encoding rounds to the
nearest representable value with ties to the even code (IEEE round-half-even), saturating at the largest finite
magnitude. This module is the reference the CUDA kernels are tested against and the CPU fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
"""Input elements sharing one E4M3 block scale."""

E2M1_MAX = 6.0
E4M3_MAX = 448.0


def _e2m1_magnitudes() -> torch.Tensor:
    # code bits: s e e m.  e == 0 is subnormal (m * 0.5); otherwise (1 + m/2) * 2^(e-1).
    values = []
    for code in range(8):
        exponent, mantissa = code >> 1, code & 1
        values.append(mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1))
    return torch.tensor(values, dtype=torch.float32)


def _e4m3_values() -> torch.Tensor:
    # E4M3 "fn" (finite, NaN only): bias 7, no infinities, S.1111.111 is NaN, max finite 448.
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values.append(float("nan"))
        elif exponent == 0:
            values.append(sign * mantissa / 8 * 2.0**-6)
        else:
            values.append(sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return torch.tensor(values, dtype=torch.float32)


E2M1_MAGNITUDES = _e2m1_magnitudes()
"""The 8 non-negative E2M1 values, indexed by the 3 magnitude bits."""
E2M1_VALUES = torch.cat([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])
"""All 16 E2M1 values indexed by the 4-bit code (bit 3 = sign; code 8 is -0.0)."""
E4M3_VALUES = _e4m3_values()
"""All 256 E4M3 values indexed by the byte (0x7F and 0xFF are NaN)."""


def _round_to_grid(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Index of the nearest grid value to |x| (grid ascending, index = code), ties to the even index,
    saturating at the last entry. NaN maps to the last entry too; callers handle NaN first."""
    grid = grid.to(device=x.device)
    magnitude = x.abs().to(torch.float32)
    upper = torch.searchsorted(grid, magnitude).clamp(max=grid.numel() - 1)
    lower = (upper - 1).clamp(min=0)
    distance_to_lower = magnitude - grid[lower]
    distance_to_upper = grid[upper] - magnitude
    pick_lower = (distance_to_lower < distance_to_upper) | (
        (distance_to_lower == distance_to_upper) & (lower % 2 == 0)
    )
    return torch.where(pick_lower, lower, upper)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round values onto E2M1 (nearest, ties to even, saturate at ±6); returns uint8 codes 0..15."""
    if torch.isnan(x).any():
        raise ValueError("encode_e2m1: input contains NaN, which E2M1 cannot represent")
    # The sign survives rounding to zero (-0.1 → code 8, "-0"), as the hardware conversion does.
    codes = _round_to_grid(x, E2M1_MAGNITUDES)
    return (codes | (torch.signbit(x).to(torch.int64) << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 → float32 values."""
    return E2M1_VALUES.to(codes.device)[codes.long()]


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round values onto E4M3 (nearest, ties to even, saturate at ±448, NaN → 0x7F); returns uint8 bytes."""
    finite_magnitudes = E4M3_VALUES[:0x7F]  # codes 0x00..0x7E, ascending
    codes = _round_to_grid(x, finite_magnitudes) | (torch.signbit(x).to(torch.int64) << 7)
    return torch.where(torch.isnan(x), torch.full_like(codes, 0x7F), codes).to(torch.uint8)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 (or float8_e4m3fn viewed as bytes) → float32 values."""
    if codes.dtype == torch.float8_e4m3fn:
        codes = codes.view(torch.uint8)
    return E4M3_VALUES.to(codes.device)[codes.long()]


def to_float8_e4m3fn(x: torch.Tensor) -> torch.Tensor:
    """Values → torch.float8_e4m3fn with the saturating round-half-even encoding above."""
    return encode_e4m3(x).view(torch.float8_e4m3fn)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes → [..., K/2] bytes; the low nibble holds the even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dimension {codes.shape[-1]} is odd")
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes → [..., K] uint8 codes (inverse of pack_e2m1)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


@dataclass
class NvFp4Weight:
    """One NVFP4 weight in canonical form (see the module docstring)."""

    packed: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2


def _divide(x: torch.Tensor, constant: float) -> torch.Tensor:
    """x / constant, correctly rounded on every device: CUDA divides by a Python number through its reciprocal
    (one bit less exact), which moves values that sit on a rounding midpoint of E2M1 / E4M3 to the other side,
    so the same weight would quantize differently on a GPU and on the CPU."""
    return x / torch.tensor(constant, dtype=x.dtype, device=x.device)


def global_decode_scale(amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor decode scale that maps the tensor's amax onto E2M1_MAX * E4M3_MAX."""
    amax = amax.to(torch.float32)
    return torch.where(amax > 0, _divide(amax, E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def quantize_nvfp4(weight: torch.Tensor, global_scale: torch.Tensor | None = None) -> NvFp4Weight:
    """NVIDIA's recipe: decode scale amax/(6*448) per tensor, per-16 E4M3 block scales, E2M1 round-half-even.

    ``global_scale`` (decode scale) may be given, e.g. to reproduce another producer's choice."""
    rows, cols = weight.shape
    if cols % BLOCK_SIZE:
        raise ValueError(f"quantize_nvfp4: K={cols} is not a multiple of {BLOCK_SIZE}")
    w = weight.to(torch.float32)
    if not torch.isfinite(w).all():
        raise ValueError("quantize_nvfp4: weight contains NaN or Inf")
    if global_scale is None:
        global_scale = global_decode_scale(w.abs().max())
    global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=w.device)
    blocks = w.reshape(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    block_scale = to_float8_e4m3fn(_divide(block_amax, E2M1_MAX) / global_scale)
    effective = decode_e4m3(block_scale) * global_scale
    scaled = torch.where(effective[..., None] > 0, blocks / effective[..., None], torch.zeros_like(blocks))
    codes = encode_e2m1(scaled.reshape(rows, cols))
    return NvFp4Weight(pack_e2m1(codes), block_scale, global_scale)


def dequantize_nvfp4(
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Packed [N, K/2] + block scales [N, K/16] + decode scale (scalar or [N]) → W [N, K] in ``dtype``.

    Computed in float32 and cast once, so fp16 output is the correctly rounded float32 product."""
    rows, half_cols = packed.shape
    cols = half_cols * 2
    if block_scale.shape != (rows, cols // BLOCK_SIZE):
        raise ValueError(
            f"dequantize_nvfp4: block_scale shape {tuple(block_scale.shape)} does not match weight "
            f"[{rows}, {cols}] (expected [{rows}, {cols // BLOCK_SIZE}])"
        )
    values = decode_e2m1(unpack_e2m1(packed)).reshape(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    scales = decode_e4m3(block_scale)[..., None]
    global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    row_scale = global_scale.reshape(-1, 1, 1) if global_scale.numel() > 1 else global_scale
    return (values * scales * row_scale).reshape(rows, cols).to(dtype)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor | float,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """FP8 E4M3 weight [N, K] with a per-tensor scale (scalar) or per-channel scale ([N] or [N, 1]) → [N, K]."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=weight.device)
    if scale.numel() > 1:
        scale = scale.reshape(-1, 1)
    return (decode_e4m3(weight) * scale).to(dtype)


def quantize_fp8(weight: torch.Tensor, per_channel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight → (float8_e4m3fn weight, float32 scale) with amax/448 scaling, per tensor or per output row."""
    w = weight.to(torch.float32)
    amax = w.abs().amax(dim=1) if per_channel else w.abs().max()
    scale = torch.where(amax > 0, _divide(amax, E4M3_MAX), torch.ones_like(amax))
    divisor = scale[:, None] if per_channel else scale
    return to_float8_e4m3fn(w / divisor), scale


def linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y = x · Wᵀ (+ bias), accumulated in float32 and returned in x's dtype."""
    y = x.to(torch.float32) @ weight.to(torch.float32).T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def nvfp4_linear_reference(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference NVFP4 linear layer: y = x · dequantize_nvfp4(W)ᵀ (+ bias)."""
    return linear_reference(x, dequantize_nvfp4(packed, block_scale, global_scale), bias)


def fp8_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference FP8-weight (W8A16) linear layer."""
    return linear_reference(x, dequantize_fp8(weight, scale), bias)
