"""README's first command: `volta-fp4 demo` serves a tiny NVFP4 model with a real vLLM engine and prints its result,
not vLLM's start-up log."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import CPU_ENGINE_ENV, requires_vllm


@requires_vllm
@pytest.mark.engine
def test_demo_prints_its_result_without_the_engine_log(tmp_path):
    result = subprocess.run([sys.executable, "-m", "vllm_volta_fp4.cli", "demo", "--dir", str(tmp_path),
                             "--max-tokens", "8"], env=CPU_ENGINE_ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "4/4 prompts give identical greedy tokens" in lines[-1]
    assert len(lines) <= 12 and not any(" INFO " in line for line in lines), result.stdout
    assert " INFO " in (tmp_path / "engine.log").read_text()  # the log is kept, beside the models
