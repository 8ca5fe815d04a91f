"""CI check that the Gated DeltaNet kernels compile for Volta (sm_70) cleanly, without a GPU.

csrc/gdn/gdn.cuh → PTX for compute_70 (CUDA 12.9 NVRTC from PyPI) → sm_70 cubin (ptxas -v), through the toolchain
helpers of tools/sm70_check.py. Fails on register spills, on more than 96 KB of shared memory per block (the
chunked-prefill kernels' dynamic shared memory comes from the header's own PrepareSmem / StateSmem) and when the
PTX lacks the Volta HMMA instruction. Missing tools fail the test under CI (CI=true) and skip it elsewhere."""

from __future__ import annotations

import re

from tests.conftest import load_sm70_check

sm70_check = load_sm70_check()

HEAD_DIMS = sm70_check.GDN_HEAD_DIMS
STATE_TYPES = sm70_check.GDN_STATE_TYPES
CONV_WIDTHS = sm70_check.GDN_CONV_WIDTHS
readable = sm70_check.gdn_readable


def test_gdn_kernels_compile_clean_for_sm70(sm70_toolchain):
    ptx, reports = sm70_check.compile_family(sm70_check.gdn_kernel_source(), sm70_check.gdn_dynamic_smem)
    smem = {f"{kind}{d}": int(v) for kind, d, v in re.findall(r"(prepare|state)_smem_d(\d+)\s*=\s*(\d+)", ptx)}
    assert len(smem) == 2 * len(HEAD_DIMS)
    for report in reports:
        print(f"{readable(report.name)}: {report.registers} registers, {report.spill_bytes} B spilled, "
              f"{report.static_smem + report.dynamic_smem} B shared memory")
    per_dim = 1 + 2 * len(STATE_TYPES) + 2  # prepare, state × 2, decode × 2, row norms × 2
    assert len(reports) == len(HEAD_DIMS) * per_dim + len(CONV_WIDTHS)
    failures = [f"{readable(r.name)}: {p}" for r in reports for p in r.problems]
    assert not failures, "\n".join(failures)
    assert sm70_check.VOLTA_HMMA in ptx
    assert all(r.dynamic_smem > 48 * 1024 for r in reports if "chunk_" in r.name and "Li128E" in r.name)
