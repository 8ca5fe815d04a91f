"""CI check that the GEMM kernels compile for Volta (sm_70) cleanly, without a GPU.

Uses CUDA 12.9 NVRTC + ptxas from PyPI (nvidia-cuda-nvrtc-cu12==12.9.86, nvidia-cuda-nvcc-cu12==12.9.86) through
tools/sm70_check.py. Missing tools fail the test under CI (CI=true) and skip it elsewhere."""

from __future__ import annotations

from tests.conftest import load_sm70_check

sm70_check = load_sm70_check()


def test_kernels_compile_clean_for_sm70(sm70_toolchain):
    reports, failures = sm70_check.check()
    for report in reports:
        print(f"{sm70_check.readable(report.name)}: {report.registers} registers, {report.spill_bytes} B spilled, "
              f"{report.static_smem + report.dynamic_smem} B shared memory")
    assert not failures, "\n".join(failures)
    volta_gemms = [r for r in reports if "Sm70Mma" in r.name]
    assert volta_gemms and all(r.registers <= 255 for r in volta_gemms)
