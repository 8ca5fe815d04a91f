"""CI check that the Gated DeltaNet kernels compile for Volta (sm_70) cleanly, without a GPU.

csrc/gdn/gdn.cuh → PTX for compute_70 (CUDA 12.9 NVRTC from PyPI) → sm_70 cubin (ptxas -v), through the toolchain
helpers of tools/sm70_check.py. Fails on register spills, on more than 96 KB of shared memory per block (the
chunked-prefill kernels' dynamic shared memory comes from the header's own PrepareSmem / StateSmem) and when the
PTX lacks the Volta HMMA instruction. Missing tools fail the test under CI (CI=true) and skip it elsewhere."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from tests.conftest import load_sm70_check

sm70_check = load_sm70_check()

HEAD_DIMS = (64, 128)
STATE_TYPES = ("float", "uint16_t")  # the state cache in float32 or fp16
CONV_WIDTHS = (2, 3, 4)


def gdn_kernel_source() -> str:
    """Every GDN kernel the extension launches on a Volta GPU (the SM70 atom only)."""
    lines = ['#include "gdn/gdn.cuh"', "namespace volta_fp4 { namespace gdn {"]
    for d in HEAD_DIMS:
        lines.append(f"template __global__ void chunk_prepare_kernel<Sm70Mma, {d}>(const ChunkParams);")
        for state in STATE_TYPES:
            lines.append(f"template __global__ void chunk_state_kernel<Sm70Mma, {d}, {state}>(const ChunkParams);")
            lines.append(f"template __global__ void recurrent_decode_kernel<{d}, {state}>(const DecodeParams);")
        for gated in ("true", "false"):
            lines.append(f"template __global__ void row_norm_kernel<{d}, {gated}>(const RowNormParams);")
    for width in CONV_WIDTHS:
        lines.append(f"template __global__ void causal_conv1d_kernel<{width}>(const ConvParams);")
    lines.append("}}")
    for d in HEAD_DIMS:
        lines.append(f"__device__ int prepare_smem_d{d} = volta_fp4::gdn::PrepareSmem<{d}>::kBytes;")
        lines.append(f"__device__ int state_smem_d{d} = volta_fp4::gdn::StateSmem<{d}>::kBytes;")
    return "\n".join(lines) + "\n"


def readable(mangled: str) -> str:
    kernel = re.search(r"gdn\d+(\w+?_kernel)", mangled).group(1)
    args = [a for a in ("Sm70Mma",) if a in mangled] + [f"{n}" for n in re.findall(r"Li(\d+)E", mangled)]
    if "_kernel" in kernel and kernel.startswith(("chunk_state", "recurrent")):
        args.append("fp32 state" if re.search(r"EfEEv", mangled) else "fp16 state")
    if kernel == "row_norm_kernel":
        args.append("gated" if "Lb1E" in mangled else "l2")
    return f"{kernel}<{', '.join(args)}>"


def test_gdn_kernels_compile_clean_for_sm70(sm70_toolchain):
    libnvrtc, ptxas = sm70_toolchain
    ptx = sm70_check.nvrtc_compile(libnvrtc, gdn_kernel_source())
    smem = {f"{kind}{d}": int(v) for kind, d, v in re.findall(r"(prepare|state)_smem_d(\d+)\s*=\s*(\d+)", ptx)}
    assert len(smem) == 2 * len(HEAD_DIMS)
    with tempfile.TemporaryDirectory() as tmp:
        reports = sm70_check.ptxas_reports(ptxas, ptx, Path(tmp))
    for i, report in enumerate(reports):
        for kind in ("prepare", "state"):
            if f"chunk_{kind}_kernel" in report.name:
                d = re.search(r"Sm70MmaELi(\d+)E", report.name).group(1)
                reports[i] = dataclasses.replace(report, dynamic_smem=smem[f"{kind}{d}"])
        print(f"{readable(report.name)}: {reports[i].registers} registers, {reports[i].spill_bytes} B spilled, "
              f"{reports[i].static_smem + reports[i].dynamic_smem} B shared memory")
    per_dim = 1 + 2 * len(STATE_TYPES) + 2  # prepare, state × 2, decode × 2, row norms × 2
    assert len(reports) == len(HEAD_DIMS) * per_dim + len(CONV_WIDTHS)
    failures = [f"{readable(r.name)}: {p}" for r in reports for p in r.problems]
    assert not failures, "\n".join(failures)
    assert sm70_check.VOLTA_HMMA in ptx
    assert all(r.dynamic_smem > 48 * 1024 for r in reports if "chunk_" in r.name and "Li128E" in r.name)
