"""CI check that the attention kernels compile for Volta (sm_70) cleanly, without a GPU.

csrc/attention/attention.cuh → PTX for compute_70 (CUDA 12.9 NVRTC from PyPI) → sm_70 cubin (ptxas -v), through the
toolchain helpers of tools/sm70_check.py. Fails on register spills, on more than 96 KB of shared memory per
block (the kernels' dynamic shared memory comes from the header's own SmemPlan) and when the PTX lacks the Volta
HMMA instruction. Missing tools fail the test under CI (CI=true) and skip it elsewhere."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from tests.conftest import load_sm70_check

sm70_check = load_sm70_check()

HEAD_SIZES = (64, 128, 256)


def attention_kernel_source() -> str:
    """Every attention kernel the extension launches on a Volta GPU (the SM70 atom only)."""
    lines = ['#include "attention/attention.cuh"', "namespace volta_fp4 { namespace attention {"]
    for d in HEAD_SIZES:
        lines.append(f"template __global__ void paged_attention_kernel<Sm70Mma, {d}>(const PagedAttentionParams);")
        lines.append(f"template __global__ void combine_splits_kernel<{d}>(const PagedAttentionParams);")
    lines.append("}}")
    for d in HEAD_SIZES:
        lines.append(f"__device__ int attention_smem_bytes_d{d} = volta_fp4::attention::attention_smem_bytes({d});")
    return "\n".join(lines) + "\n"


def test_attention_kernels_compile_clean_for_sm70(sm70_toolchain):
    libnvrtc, ptxas = sm70_toolchain
    ptx = sm70_check.nvrtc_compile(libnvrtc, attention_kernel_source())
    smem_of_head_size = {int(d): int(v) for d, v in re.findall(r"attention_smem_bytes_d(\d+)\s*=\s*(\d+)", ptx)}
    assert sorted(smem_of_head_size) == list(HEAD_SIZES)
    with tempfile.TemporaryDirectory() as tmp:
        reports = sm70_check.ptxas_reports(ptxas, ptx, Path(tmp))
    for i, report in enumerate(reports):
        if "paged_attention_kernel" in report.name:
            head_size = int(re.search(r"ELi(\d+)EEEv", report.name).group(1))
            reports[i] = dataclasses.replace(report, dynamic_smem=smem_of_head_size[head_size])
        print(f"{report.name}: {reports[i].registers} registers, {reports[i].spill_bytes} B spilled, "
              f"{reports[i].static_smem + reports[i].dynamic_smem} B shared memory")
    assert len(reports) == 2 * len(HEAD_SIZES) + 1  # + write_kv_cache_kernel, defined (not templated) in the header
    failures = [f"{r.name}: {p}" for r in reports for p in r.problems]
    assert not failures, "\n".join(failures)
    assert sm70_check.VOLTA_HMMA in ptx
    assert all(r.dynamic_smem > 64 * 1024 for r in reports if "ELi256E" in r.name and "paged" in r.name)
