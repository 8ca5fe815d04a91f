"""Compile and run a small C++ program against csrc/'s torch- and CUDA-free headers with the host compiler: how the
tests check the host code's decisions (the *_plan.h headers) without a GPU or the extension."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"

requires_host_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")


def run_host_program(tmp_path: Path, headers: list[str], body: list[str], preamble: str = "") -> str:
    """Standard output of ``int main() { body }`` compiled with csrc/'s ``headers`` included (and ``preamble``
    after them)."""
    program = tmp_path / "host_program.cpp"
    lines = ["#include <cstdio>", *(f'#include "{header}"' for header in headers), preamble, "int main() {", *body, "}"]
    program.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "host_program"
    subprocess.run(["g++", "-std=c++17", f"-I{CSRC}", str(program), "-o", str(binary)], check=True)
    return subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
