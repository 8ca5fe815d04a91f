"""vllm_volta_fp4.envs: the one reader of VLLM_VOLTA_FP4_*; every variable parsed strictly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_volta_fp4 import envs

READERS = {envs.ATTENTION: envs.attention_choice, envs.GDN: envs.gdn_choice, envs.MMA: envs.mma_atom,
           envs.GEMV_MAX_M: envs.gemv_max_m, envs.CUBLAS_MIN_M: envs.cublas_min_m,
           envs.DEQUANT_CHUNK_MIB: envs.dequant_chunk_mib,
           envs.DRAFT_WEIGHTS: envs.draft_weights_format, envs.BUILD_EXT: envs.build_extension,
           envs.TORCH_INCLUDE: envs.torch_include}
REPO = Path(__file__).resolve().parents[1]


def test_every_variable_has_a_reader():
    assert set(READERS) == set(envs.VARIABLES)


@pytest.mark.parametrize("variable", envs.VARIABLES, ids=lambda v: v.name)
def test_an_unknown_value_names_the_variable_and_what_it_accepts(monkeypatch, variable):
    monkeypatch.setenv(variable.name, "sm75-please")
    with pytest.raises(ValueError) as error:
        READERS[variable]()
    assert f"{variable.name}='sm75-please'" in str(error.value) and variable.accepts in str(error.value)


@pytest.mark.parametrize("variable, value, expected", [
    (envs.ATTENTION, None, envs.VOLTA), (envs.ATTENTION, " Force ", envs.FORCE), (envs.ATTENTION, "0", envs.OFF),
    (envs.GDN, "yes", envs.VOLTA), (envs.GDN, "off", envs.OFF),
    (envs.MMA, None, 0), (envs.MMA, "SM70", 70), (envs.MMA, "sm80", 80), (envs.MMA, "auto", 0),
    (envs.GEMV_MAX_M, None, None), (envs.GEMV_MAX_M, "0", 0), (envs.GEMV_MAX_M, "4", 4),
    (envs.CUBLAS_MIN_M, "129", 129), (envs.DEQUANT_CHUNK_MIB, None, None), (envs.DEQUANT_CHUNK_MIB, "24", 24),
    (envs.DRAFT_WEIGHTS, None, "fp8"), (envs.DRAFT_WEIGHTS, "Off", None),
    (envs.DRAFT_WEIGHTS, "on", "fp8"), (envs.DRAFT_WEIGHTS, "NVFP4", "nvfp4"), (envs.DRAFT_WEIGHTS, "fp16", None),
    (envs.BUILD_EXT, "1", True), (envs.BUILD_EXT, "0", False),
    (envs.BUILD_EXT, None, False), (envs.TORCH_INCLUDE, None, None), (envs.TORCH_INCLUDE, "/", "/"),
], ids=str)
def test_accepted_values(monkeypatch, variable, value, expected):
    if value is None:
        monkeypatch.delenv(variable.name, raising=False)
    else:
        monkeypatch.setenv(variable.name, value)
    assert READERS[variable]() == expected


@pytest.mark.parametrize("variable, value", [(envs.GEMV_MAX_M, "-1"), (envs.CUBLAS_MIN_M, "0"),
                                             (envs.CUBLAS_MIN_M, "1.5"), (envs.DEQUANT_CHUNK_MIB, "0")], ids=str)
def test_counts_out_of_range_are_refused(monkeypatch, variable, value):
    monkeypatch.setenv(variable.name, value)
    with pytest.raises(ValueError, match=variable.name):
        READERS[variable]()


def test_no_other_module_reads_our_variables():
    """Only envs.py (and setup.py, through envs.py) may name VLLM_VOLTA_FP4_* in an environment read."""
    read = re.compile(r"(os\.environ(\.get)?\s*[\[(]\s*|getenv\(\s*)[\"']VLLM_VOLTA_FP4_")
    offenders = [str(path.relative_to(REPO)) for folder in ("vllm_volta_fp4", "csrc")
                 for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".cu", ".cuh", ".cpp")
                 and path.name != "envs.py" and read.search(path.read_text())]
    assert not offenders


def test_readme_lists_every_variable():
    readme = (REPO / "README.md").read_text()
    assert [v.name for v in envs.VARIABLES if v.name not in readme] == []


def test_setup_py_reads_the_build_switch_through_envs():
    result = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, capture_output=True, text=True,
                            env={"VLLM_VOLTA_FP4_BUILD_EXT": "maybe", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode != 0 and "VLLM_VOLTA_FP4_BUILD_EXT='maybe'" in result.stderr
