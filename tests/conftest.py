"""Shared fixtures: tiny NVFP4 checkpoints made here, once per test session."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest

from vllm_volta_fp4.testing.tiny_model import FORMATS, MTP_STORAGE, make_tiny_checkpoint

HAS_VLLM = importlib.util.find_spec("vllm") is not None
IN_CI = os.environ.get("CI", "").lower() == "true"


def load_sm70_check():
    """tools/sm70_check.py as a module (it is a script, not part of the package)."""
    if "sm70_check" not in sys.modules:
        from pathlib import Path

        spec = importlib.util.spec_from_file_location(
            "sm70_check", Path(__file__).resolve().parents[1] / "tools" / "sm70_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["sm70_check"]


@pytest.fixture
def sm70_toolchain():
    """(libnvrtc, ptxas) of CUDA 12.9; without them the test fails under CI (which installs them) and skips
    elsewhere."""
    sm70_check = load_sm70_check()
    try:
        return sm70_check.find_toolchain()
    except sm70_check.ToolchainMissing as missing:
        if IN_CI:
            pytest.fail(str(missing))
        pytest.skip(str(missing))
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{format: path} of tiny Llama-shaped checkpoints in every producer format (same seed, same weights)."""
    root = tmp_path_factory.mktemp("tiny")
    return {fmt: make_tiny_checkpoint(root / fmt, "llama", fmt) for fmt in FORMATS}


@pytest.fixture(scope="session")
def mtp_checkpoints(tmp_path_factory):
    """{(format, mtp storage): path} of tiny Qwen3.5 checkpoints with a one-layer MTP module, in every producer
    format, the MTP module excluded from quantization (as real exports ship it) or NVFP4 too."""
    root = tmp_path_factory.mktemp("tiny-mtp")
    return {(fmt, mtp): make_tiny_checkpoint(root / f"{fmt}-mtp-{mtp}", "qwen3_5", fmt, mtp=mtp)
            for fmt in FORMATS for mtp in MTP_STORAGE}


@pytest.fixture
def fresh_checkpoint(tmp_path):
    """A factory for a private checkpoint a test may damage."""

    def make(fmt: str = "modelopt-nvfp4", arch: str = "llama"):
        return make_tiny_checkpoint(tmp_path / f"{arch}-{fmt}", arch, fmt)

    return make


@pytest.fixture
def simulated_tp(monkeypatch):
    """Make vLLM's linear layers and parameters believe they are rank ``rank`` of ``size``."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor import parameter
    from vllm.model_executor.layers import linear

    def set_rank(rank: int, size: int) -> None:
        for module in (linear, parameter):
            monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
            monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: size)

    with set_current_vllm_config(VllmConfig()):
        yield set_rank


SERVER_START_TIMEOUT_S = 300
SERVER_MAX_MODEL_LEN = 512
CPU_ENGINE_ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def openai_server(tiny_checkpoints, tmp_path_factory):
    """One vLLM OpenAI-compatible server for the session: CPU engine, the tiny ModelOpt NVFP4 model through
    volta_nvfp4, float32, in vLLM's default mode (torch.compile, as `vllm serve` runs without --enforce-eager), bound
    to 127.0.0.1 and stopped by its process group."""
    pytest.importorskip("vllm")
    model = str(tiny_checkpoints["modelopt-nvfp4"])
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--quantization", "volta_nvfp4", "--dtype", "float32",
               "--max-model-len", str(SERVER_MAX_MODEL_LEN), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as sink:
        process = subprocess.Popen(command, env=CPU_ENGINE_ENV, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not healthy after {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield SimpleNamespace(url=url, model=model, max_model_len=SERVER_MAX_MODEL_LEN)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
