"""What vLLM's compiled model forward reaches of the plugin traces under torch.compile(fullgraph=True) with the
CUDA-kernel branch taken — checked on a CPU machine (tests/plugin/trace_probe.py, in a fresh interpreter, stands
in for the extension and for CUDA). The crash it guards against: Dynamo reaching the extension's import and its
fake registrations (cached on first use) from inside ``QuantizedLinearMethod.apply``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import requires_vllm

PROBE = Path(__file__).with_name("trace_probe.py")
ROOT = PROBE.parents[2]
CHECKS = ["nvfp4 linear apply", "fp8 linear apply", "gated RMSNorm override", "attention ops", "GDN decode ops",
          "GDN prefill ops"]


@pytest.fixture(scope="module")
def probe_results() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(line[len("RESULTS "):])


def test_the_probe_runs_every_check(probe_results):
    assert sorted(probe_results) == sorted(CHECKS)


@requires_vllm
@pytest.mark.parametrize("check", CHECKS)
def test_traces_with_fullgraph_on_the_kernel_path(probe_results, check):
    assert probe_results[check] == "ok", probe_results[check]


def test_the_stand_in_defines_every_op_the_plugin_calls():
    """The probe's schemas come from csrc/; every torch.ops.volta_fp4 name the Python calls must be among them."""
    import re

    sys.path.insert(0, str(PROBE.parent))
    try:
        import trace_probe
    finally:
        sys.path.pop(0)
    defined = {schema.split("(")[0] for schema in trace_probe.extension_schemas()}
    called = set()
    for source in (ROOT / "vllm_volta_fp4" / "ops").glob("*.py"):
        called |= set(re.findall(r"torch\.ops\.volta_fp4\.(\w+)", source.read_text()))
    assert called and called <= defined, sorted(called - defined)
