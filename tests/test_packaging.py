"""What `pip install` gets: the sdist carries the kernel sources and the kernel-image compiler, a wheel built from it
refuses loudly to go without the extension when asked for it, and the wheel installs the product only (no
development aids, no tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("build")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300)
    (archive,) = out.glob("*.tar.gz")
    return archive


def _wheel_from(sdist: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_VOLTA_FP4_")}
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(sdist)], env={**environment, **env}, capture_output=True, text=True, timeout=600)


def test_the_sdist_carries_every_kernel_source(sdist):
    with tarfile.open(sdist) as archive:
        packed = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    sources = {str(path.relative_to(REPO)) for path in (REPO / "csrc").rglob("*") if path.is_file()}
    sources.add("tools/sm70_check.py")  # setup.py's kernel-image build
    assert sources and sources <= packed, sorted(sources - packed)


def test_a_wheel_from_the_sdist_fails_loudly_when_the_extension_cannot_be_built(sdist, tmp_path):
    """Asked for the extension, the build stops before compiling anything and says why (here: torch headers without
    the stable ABI), instead of quietly installing pure Python."""
    result = _wheel_from(sdist, tmp_path, VLLM_VOLTA_FP4_BUILD_EXT="1", VLLM_VOLTA_FP4_TORCH_INCLUDE=str(tmp_path))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "VLLM_VOLTA_FP4_BUILD_EXT=1 but the CUDA extension cannot be built" in output
    assert f"{tmp_path} has no torch/csrc/stable/library.h" in output
    assert not list(tmp_path.glob("*.whl"))


def test_the_wheel_installs_the_product_only(sdist, tmp_path):
    result = _wheel_from(sdist, tmp_path, VLLM_VOLTA_FP4_BUILD_EXT="0")
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "vllm_volta_fp4" in tops
    assert not tops & {"devkit", "tests", "benchmarks", "scripts", "tools"}, tops
