"""The wheel's build without nvcc (tools/build_wheel.sh, csrc/driver/): the host code launches exactly the kernels
of the kernel table that the wheel build compiles, and the NVRTC + ptxas image build gives each of them sm_70
machine code (a subset here, to keep CI fast; ``tools/sm70_check.py --wheel`` checks a whole wheel)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import sm70_check  # noqa: E402


def _toolchain_or_skip() -> None:
    try:
        sm70_check.find_toolchain()
    except sm70_check.ToolchainMissing as error:
        pytest.skip(str(error))


# Each family's host decisions and the namespace of its launched_kernel_names(), in kernel_expressions()'s order.
PLAN_HEADERS = {"gemm/weight_gemm_plan.h": "volta_fp4", "attention/attention_plan.h": "volta_fp4::attention",
                "gdn/gdn_plan.h": "volta_fp4::gdn"}


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_host_code_launches_the_kernel_table(tmp_path):
    program = tmp_path / "names.cpp"
    lines = ["#include <cstdio>", *(f'#include "{header}"' for header in PLAN_HEADERS), "int main() {"]
    lines += [f"  for (const auto& n : {namespace}::launched_kernel_names()) std::puts(n.c_str());"
              for namespace in PLAN_HEADERS.values()]
    program.write_text("\n".join([*lines, "}"]) + "\n")
    subprocess.run(["g++", "-std=c++17", f"-I{REPO / 'csrc'}", str(program), "-o", str(tmp_path / "names")],
                   check=True)
    launched = subprocess.run([str(tmp_path / "names")], check=True, capture_output=True, text=True).stdout.split("\n")
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


def _op_schemas(paths) -> dict[str, str]:
    """{op name: schema} of every ``m.def("…" "…")`` in the given sources (adjacent literals joined)."""
    schemas = {}
    for path in paths:
        for match in re.finditer(r'm\.def\(((?:\s*"[^"]*")+)', path.read_text()):
            schema = "".join(re.findall(r'"([^"]*)"', match.group(1)))
            schemas[schema.split("(", 1)[0]] = schema
    return schemas


def test_the_wheel_defines_every_op_of_the_nvcc_build():
    """The compiler-free host code (csrc/driver/) registers the same ops with the same schemas as the nvcc build, so
    Python sees one library whichever build is installed."""
    nvcc = _op_schemas(sorted((REPO / "csrc").glob("*/*.cu")))
    driver = _op_schemas(sorted((REPO / "csrc" / "driver").glob("*.cpp")))
    assert len(nvcc) == 13
    assert driver == nvcc
