"""The wheel's build without nvcc (tools/build_wheel.sh, csrc/driver/): the host code launches exactly the kernels
of the kernel table that the wheel build compiles, and the NVRTC + ptxas image build gives each of them sm_70
machine code (a subset here, to keep CI fast; ``tools/sm70_check.py --wheel`` checks a whole wheel)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import sm70_check  # noqa: E402

from tests.host_program import requires_host_compiler, run_host_program  # noqa: E402
from tests.plugin.trace_probe import extension_schemas  # noqa: E402


def _toolchain_or_skip() -> None:
    try:
        sm70_check.find_toolchain()
    except sm70_check.ToolchainMissing as error:
        pytest.skip(str(error))


# Each family's host decisions and the namespace of its launched_kernel_names(), in kernel_expressions()'s order.
PLAN_HEADERS = {"gemm/weight_gemm_plan.h": "volta_fp4", "attention/attention_plan.h": "volta_fp4::attention",
                "gdn/gdn_plan.h": "volta_fp4::gdn"}


@requires_host_compiler
def test_host_code_launches_the_kernel_table(tmp_path):
    body = [f"  for (const auto& n : {namespace}::launched_kernel_names()) std::puts(n.c_str());"
            for namespace in PLAN_HEADERS.values()]
    launched = run_host_program(tmp_path, list(PLAN_HEADERS), body).split("\n")
    assert [n for n in launched if n] == sm70_check.kernel_expressions()


def test_image_build_gives_each_kernel_sm70_machine_code(tmp_path):
    _toolchain_or_skip()
    # Both families' headers are in the image; write_kv_cache_kernel is no template, so it is always compiled.
    subset = [e for e in sm70_check.kernel_expressions() if "dequantize_tiles_kernel" in e or "write_kv" in e]
    assert len(subset) == 3
    reports = sm70_check.build_image(tmp_path, subset)
    table = dict(line.split("\t") for line in (tmp_path / sm70_check.IMAGE_NAMES).read_text().splitlines())
    assert sorted(table) == sorted(subset)
    assert sorted(r.name for r in reports) == sorted(table.values())
    assert all(r.spill_bytes == 0 for r in reports)
    assert sm70_check.cubin_missing(tmp_path / sm70_check.IMAGE_CUBIN, table.values()) == []
    ptx80 = (tmp_path / sm70_check.IMAGE_PTX80).read_text()
    assert ".target sm_80" in ptx80 and all(f".entry {name}(" in ptx80 for name in table.values())
    # A kernel that is not in the cubin is reported missing (the check can fail).
    assert sm70_check.cubin_missing(tmp_path / sm70_check.IMAGE_CUBIN, ["_Z6absentv"]) == ["_Z6absentv"]


def _defined_ops() -> dict[str, str]:
    """{op name: schema} of every op the host code defines (read as the trace probe reads them)."""
    return {schema.split("(", 1)[0]: schema for schema in extension_schemas()}


def _python_ops(pattern: str) -> set[str]:
    """The op names that the Python op faces (vllm_volta_fp4/ops/) name in ``pattern``'s one group."""
    return {name for path in (REPO / "vllm_volta_fp4" / "ops").glob("*.py")
            for name in re.findall(pattern, path.read_text())}


def test_the_host_code_defines_exactly_the_ops_python_calls():
    """Every op the op faces call is defined by the extension's host code, and the host code defines no op nobody
    calls; each op that runs inside a traced model forward has a fake (torch.compile's shape function)."""
    defined = _defined_ops()
    called = _python_ops(r"torch\.ops\.volta_fp4\.(\w+)")
    assert len(defined) == 13
    assert called == set(defined)
    faked = _python_ops(r'register_fake\(\s*"volta_fp4::(\w+)"')
    assert faked and faked <= set(defined)
