"""CI check that the attention kernels compile for Volta (sm_70) cleanly, without a GPU.

csrc/attention/attention.cuh → PTX for compute_70 (CUDA 12.9 NVRTC from PyPI) → sm_70 cubin (ptxas -v), through the
toolchain helpers of tools/sm70_check.py. Fails on register spills, on more than 96 KB of shared memory per
block (the kernels' dynamic shared memory comes from the header's own SmemPlan) and when the PTX lacks the Volta
HMMA instruction. Missing tools fail the test under CI (CI=true) and skip it elsewhere."""

from __future__ import annotations

from tests.conftest import load_sm70_check

sm70_check = load_sm70_check()

HEAD_SIZES = sm70_check.ATTENTION_HEAD_SIZES
BLOCK_ROWS = sm70_check.ATTENTION_BLOCK_ROWS


def test_attention_kernels_compile_clean_for_sm70(sm70_toolchain):
    ptx, reports = sm70_check.compile_family(sm70_check.attention_kernel_source(), sm70_check.attention_dynamic_smem)
    smem = sm70_check.attention_smem_table(ptx)
    assert sorted(smem) == sorted((d, r) for d in HEAD_SIZES for r in BLOCK_ROWS)
    for report in reports:
        print(f"{report.name}: {report.registers} registers, {report.spill_bytes} B spilled, "
              f"{report.static_smem + report.dynamic_smem} B shared memory")
    # paged attention per (head size, block rows), combine per head size, + write_kv_cache_kernel (not templated)
    assert len(reports) == len(HEAD_SIZES) * (len(BLOCK_ROWS) + 1) + 1
    failures = [f"{r.name}: {p}" for r in reports for p in r.problems]
    assert not failures, "\n".join(failures)
    assert sm70_check.VOLTA_HMMA in ptx
    # the header's plan reaches the reports: head_dim 256 prefill blocks need more than 64 KB, decode blocks less
    assert all(r.dynamic_smem > 64 * 1024 for r in reports if "ELi256ELi64E" in r.name)
    assert all(r.dynamic_smem < 64 * 1024 for r in reports if "ELi256ELi16E" in r.name)
