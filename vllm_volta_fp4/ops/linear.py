"""The NVFP4 / FP8 weight GEMMs of the CUDA extension (csrc/gemm).

The linear methods call ``prepare_*`` once at load (repacking into the kernels' tile layout, documented in
csrc/gemm/weight_gemm.cuh) and ``*_linear`` per forward. Tile shapes, the MMA atom and the choice between the fused
kernel and dequantize + cuBLAS live in C++; Python passes only:
  * ``mma``: the MMA atom (vllm_volta_fp4.ops.extension.default_mma).
  * ``path``: 0 = by M, 1 = fused kernel, 2 = dequantize + cuBLAS, 3 = GEMV for M <= 16 (weights decoded in
    registers into MMA fragments; tests and benchmarks pin one). ``auto`` takes the GEMV for M <= 16
    (VLLM_VOLTA_FP4_GEMV_MAX_M lowers that; 0 disables it), the fused kernel up to M = 128 and dequantize + cuBLAS
    beyond (VLLM_VOLTA_FP4_CUBLAS_MIN_M). The fused kernel and the GEMV use the MMA atom ``mma`` selects.
Fake (meta) implementations are registered so torch.compile / vLLM's compilation can trace the ops.
"""

from __future__ import annotations

import torch

from vllm_volta_fp4 import envs
from vllm_volta_fp4.ops.extension import OpFamily, default_mma

PATH_AUTO, PATH_FUSED, PATH_DEQUANT_CUBLAS, PATH_GEMV = 0, 1, 2, 3
_OPS = OpFamily("nvfp4_gemm")


def is_available() -> bool:
    """The extension is importable and a CUDA device is usable (queries CUDA: not for traced code)."""
    return _OPS.available()


def runs_on(x: torch.Tensor) -> bool:
    """The GEMM kernels take activations ``x``: the ops are built and ``x`` is on CUDA. A module value and a
    tensor property only, so that it traces under torch.compile."""
    return _OPS.runs_on(x)


def _require_extension() -> None:
    if not _OPS.loaded:
        raise RuntimeError("vllm_volta_fp4._C is not installed (install the wheel; from a checkout: "
                           "bash tools/build_wheel.sh && pip install dist/vllm_volta_fp4-*.whl)")


def prepare_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor,
                  global_scale: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """Checkpoint NVFP4 tensors → kernel layout. ``global_scale``: decode scale, scalar or float32 [N]."""
    _require_extension()
    global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    tiles, row_scale, counters = torch.ops.volta_fp4.prepare_nvfp4(packed, block_scale, global_scale)
    return {"weight_tiles": tiles, "row_scale": row_scale, "split_k_counters": counters}


def prepare_fp8(weight_fp8: torch.Tensor, scale: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """FP8 E4M3 weight [N, K] with float32 scale (scalar or [N]) → kernel layout."""
    _require_extension()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=weight_fp8.device)
    tiles, row_scale, counters = torch.ops.volta_fp4.prepare_fp8(weight_fp8, scale)
    return {"weight_tiles": tiles, "row_scale": row_scale, "split_k_counters": counters}


def _linear(op, x: torch.Tensor, prepared: dict[str, torch.Tensor], bias: torch.Tensor | None, mma: int | None,
            path: int) -> torch.Tensor:
    out_features = prepared["row_scale"].shape[0]
    if x.dtype != torch.float16:  # the op checks shapes and the rest; this one reads better from Python
        raise TypeError(f"x must be float16, got {x.dtype}")
    y = op(x.reshape(-1, x.shape[-1]), prepared["weight_tiles"], prepared["row_scale"], prepared["split_k_counters"],
           bias, default_mma() if mma is None else mma, path)
    return y.reshape(*x.shape[:-1], out_features)


def nvfp4_linear(x: torch.Tensor, prepared: dict[str, torch.Tensor], bias: torch.Tensor | None = None, *,
                 mma: int | None = None, path: int = PATH_AUTO) -> torch.Tensor:
    """y = x · Wᵀ + bias for x [..., K] fp16; returns [..., N] fp16."""
    return _linear(torch.ops.volta_fp4.nvfp4_gemm, x, prepared, bias, mma, path)


def fp8_linear(x: torch.Tensor, prepared: dict[str, torch.Tensor], bias: torch.Tensor | None = None, *,
               mma: int | None = None, path: int = PATH_AUTO) -> torch.Tensor:
    """W8A16: y = x · (W_fp8 · scale)ᵀ + bias for x [..., K] fp16; returns [..., N] fp16."""
    return _linear(torch.ops.volta_fp4.fp8_gemm, x, prepared, bias, mma, path)


def configure_from_environment() -> None:
    """The cut-overs of PATH_AUTO and the dequantize + cuBLAS chunk, from the environment (at import)."""
    settings = (envs.gemv_max_m(), envs.cublas_min_m(), envs.dequant_chunk_mib())
    torch.ops.volta_fp4.configure_gemm(*(-1 if value is None else value for value in settings))  # -1: the default


def _on_load() -> None:
    configure_from_environment()
    _register_fakes()


def _register_fakes() -> None:
    # Only the per-forward GEMMs are traced; repacking runs eagerly at load, so it needs no fake (and Python
    # never has to know the tile layout).
    def gemm_fake(x, weight_tiles, row_scale, split_k_counters, bias, mma, path):
        return x.new_empty((x.shape[0], row_scale.shape[0]))

    torch.library.register_fake("volta_fp4::nvfp4_gemm")(gemm_fake)
    torch.library.register_fake("volta_fp4::fp8_gemm")(gemm_fake)


_OPS.on_load(_on_load)
