"""Every ``VLLM_VOLTA_FP4_*`` environment variable, read here and nowhere else, and parsed strictly: a value
outside what a variable accepts stops with an error naming the variable and what it accepts.

Imports nothing but the standard library: setup.py loads this file by path at build time, and the platform plugin
reads it while vLLM resolves its platform."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Values of the on/off/force switches (attention backend, GDN kernels).
OFF, VOLTA, FORCE = "off", "volta", "force"
_SWITCH = {"": VOLTA, "1": VOLTA, "on": VOLTA, "true": VOLTA, "yes": VOLTA, "force": FORCE,
           "0": OFF, "off": OFF, "false": OFF, "no": OFF}
_SWITCH_ACCEPTS = "1 / on / true / yes (compute capability 7.x), force (any CUDA GPU) or 0 / off / false / no"


@dataclass(frozen=True)
class Variable:
    name: str
    accepts: str
    meaning: str


ATTENTION = Variable("VLLM_VOLTA_FP4_ATTENTION", _SWITCH_ACCEPTS,
                     "the VOLTA_HMMA attention backend as vLLM's default (unset: on compute capability 7.x)")
GDN = Variable("VLLM_VOLTA_FP4_GDN", _SWITCH_ACCEPTS,
               "the plugin's Gated-DeltaNet kernels inside vLLM's GDN layers (unset: on compute capability 7.x)")
MMA = Variable("VLLM_VOLTA_FP4_MMA", "sm70, sm80 or auto", "force an MMA atom (unset/auto: by compute capability)")
GEMV_MAX_M = Variable("VLLM_VOLTA_FP4_GEMV_MAX_M", "an integer ≥ 0",
                      "largest M the GEMM's automatic choice sends to the GEMV (0: never; default and maximum 16)")
CUBLAS_MIN_M = Variable("VLLM_VOLTA_FP4_CUBLAS_MIN_M", "an integer ≥ 1",
                        "smallest M that runs dequantize + cuBLAS instead of the fused kernel (default 129)")
DEQUANT_CHUNK_MIB = Variable("VLLM_VOLTA_FP4_DEQUANT_CHUNK_MIB", "an integer ≥ 1",
                             "fp16 scratch (MiB) of one chunk of weight rows that dequantize + cuBLAS dequantizes "
                             "before its cuBLAS call (default 128)")
DRAFT_FP8, DRAFT_NVFP4 = "fp8", "nvfp4"
DRAFT_WEIGHTS = Variable("VLLM_VOLTA_FP4_DRAFT_WEIGHTS", "fp8 / 1 / on, nvfp4 or 0 / off / fp16",
                         "the format of the MTP drafter's 16-bit weights (its layers, quantized in place) and of the "
                         "lm_head copy its drafts score the vocabulary with, where the plugin's CUDA kernels run "
                         "(unset: fp8; off: 16 bits, as vLLM drafts)")
BUILD_EXT = Variable("VLLM_VOLTA_FP4_BUILD_EXT", "1 (build or fail) or 0",
                     "at build: 1 builds the CUDA extension without a CUDA compiler (NVRTC/ptxas kernel image + C++ "
                     "host code on torch's stable ABI; what tools/build_wheel.sh sets); unset/0: pure Python")
TORCH_INCLUDE = Variable("VLLM_VOLTA_FP4_TORCH_INCLUDE", "an existing directory",
                         "at build: torch >= 2.10's C++ headers for the extension's host code (unset: the build "
                         "environment's torch)")
VARIABLES = (ATTENTION, GDN, MMA, GEMV_MAX_M, CUBLAS_MIN_M, DEQUANT_CHUNK_MIB, DRAFT_WEIGHTS, BUILD_EXT,
             TORCH_INCLUDE)


def _raw(variable: Variable) -> str | None:
    value = os.environ.get(variable.name)
    return None if value is None else value.strip().lower()


def _invalid(variable: Variable) -> ValueError:
    return ValueError(f"{variable.name}={os.environ[variable.name]!r}: expected {variable.accepts}")


def _switch(variable: Variable) -> str:
    value = _raw(variable)
    if value is None:
        return VOLTA
    if value not in _SWITCH:
        raise _invalid(variable)
    return _SWITCH[value]


def attention_choice() -> str:
    """OFF, VOLTA (default: compute capability 7.x only) or FORCE (any CUDA GPU)."""
    return _switch(ATTENTION)


def gdn_choice() -> str:
    """OFF, VOLTA (default: compute capability 7.x only) or FORCE (any CUDA GPU)."""
    return _switch(GDN)


def mma_atom() -> int:
    """0 (by compute capability), 70 or 80."""
    value = _raw(MMA)
    atoms = {None: 0, "": 0, "auto": 0, "sm70": 70, "sm80": 80}
    if value not in atoms:
        raise _invalid(MMA)
    return atoms[value]


def _count(variable: Variable, minimum: int) -> int | None:
    value = _raw(variable)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise _invalid(variable) from None
    if number < minimum:
        raise _invalid(variable)
    return number


def gemv_max_m() -> int | None:
    """The GEMV cut-over, or None for the extension's default."""
    return _count(GEMV_MAX_M, 0)


def cublas_min_m() -> int | None:
    """The dequantize + cuBLAS cut-over, or None for the extension's default."""
    return _count(CUBLAS_MIN_M, 1)


def dequant_chunk_mib() -> int | None:
    """The dequantize + cuBLAS chunk in MiB, or None for the extension's default."""
    return _count(DEQUANT_CHUNK_MIB, 1)


def draft_weights_format() -> str | None:
    """DRAFT_FP8 (default), DRAFT_NVFP4, or None (the drafter keeps its 16-bit weights and drafts with the 16-bit
    head)."""
    value = _raw(DRAFT_WEIGHTS)
    choices = {None: DRAFT_FP8, "": DRAFT_FP8, "1": DRAFT_FP8, "on": DRAFT_FP8, "true": DRAFT_FP8, "yes": DRAFT_FP8,
               "fp8": DRAFT_FP8, "nvfp4": DRAFT_NVFP4, "0": None, "off": None, "false": None, "no": None, "fp16": None}
    if value not in choices:
        raise _invalid(DRAFT_WEIGHTS)
    return choices[value]


def compile_factors() -> dict[str, object]:
    """The settings that change what the plugin puts into a compiled graph (which GEMM op the MTP drafter calls, a
    forced MMA atom passed to every GEMM as a constant), for vLLM's torch.compile cache key."""
    return {"mma": mma_atom(), "draft_weights": draft_weights_format() or "16-bit"}


def build_extension() -> bool:
    """Whether setup.py builds the CUDA extension (and fails if it cannot)."""
    value = _raw(BUILD_EXT)
    choices = {None: False, "": False, "1": True, "0": False}
    if value not in choices:
        raise _invalid(BUILD_EXT)
    return choices[value]


def torch_include() -> str | None:
    """The torch include directory the extension's build is given, or None."""
    value = os.environ.get(TORCH_INCLUDE.name)
    if not value:
        return None
    if not os.path.isdir(value):
        raise _invalid(TORCH_INCLUDE)
    return value
