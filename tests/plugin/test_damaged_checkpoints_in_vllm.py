"""vLLM refuses a damaged checkpoint with the message `volta-fp4 inspect` gives, before any weight is read.

The check runs in the quantization config's ``maybe_update_config``, which every supported vLLM calls while it
builds its engine config (in the front-end process, before an engine core starts). So the corpus is run through
vLLM's own ``EngineArgs.create_engine_config`` in-process (milliseconds per case); one real ``LLM(...)`` start on a
damaged checkpoint shows the line is what the log ends with. Valid checkpoints loading for real: test_engine.py."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import CPU_ENGINE_ENV, requires_vllm
from tests.format import damage_corpus
from vllm_volta_fp4.format.checkpoint import Checkpoint, CheckpointError
from vllm_volta_fp4.testing.tiny_model import FORMATS, make_tiny_checkpoint

pytestmark = requires_vllm

# vLLM's and transformers' config parsing fail on these before any plugin code runs, with their own message;
# inspect and doctor report them clearly.
_BEFORE_THE_PLUGIN = ("a JSON list", "hidden_size a string", "quantization_config: garbage",
                      "quantization_config a list", "quant_method a number", "a JSON string", "quantization a list",
                      "quant_algo a number")


def _engine_config(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model_dir), quantization="volta_nvfp4", dtype="float32", enforce_eager=True,
                      max_model_len=256).create_engine_config()


def _inspect_message(model_dir) -> str:
    with pytest.raises(CheckpointError) as refused:
        Checkpoint(model_dir).validate()
    return str(refused.value)


def _representatives(source, fmt):
    """One damage of each kind (a tensor missing, mistyped, misshapen; a layer missing or extra; each config
    damage), so every path into the refusal is crossed once per format."""
    by_kind = {}
    for case, refused in damage_corpus.tensor_damages(source, "llama"):
        kind = case.label.split(" ")[0] if not case.label.startswith("model") else case.label.split(" ")[1]
        if refused:
            by_kind.setdefault(kind, case)
    return [*by_kind.values(), *(case for case in damage_corpus.config_damages(source, fmt, "llama")
                                 if case.label.partition(": ")[2] not in _BEFORE_THE_PLUGIN)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_vllm_refuses_each_kind_of_damage_with_the_inspect_message(tmp_path, fmt):
    from vllm_volta_fp4.plugin.quantization.config import CheckpointRefused

    source = make_tiny_checkpoint(tmp_path / "pristine", "llama", fmt)
    assert _engine_config(source).quant_config is not None  # the valid checkpoint passes the same path
    cases, failures = _representatives(source, fmt), []
    for number, case in enumerate(cases):
        target = tmp_path / f"case-{number}"
        shutil.copytree(source, target)
        case.apply(target)
        expected = f"volta_nvfp4 cannot serve this checkpoint: {_inspect_message(target)}"
        try:
            _engine_config(target)
            failures.append(f"{case}: loaded")
        except CheckpointRefused as refused:
            if str(refused) != expected:
                failures.append(f"{case}: {refused} != {expected}")
        except Exception as other:  # vLLM's own error instead of ours
            failures.append(f"{case}: {type(other).__name__}: {str(other)[:300]}")
    assert len(cases) >= 12 and not failures, failures


@pytest.mark.engine
def test_a_real_engine_start_logs_our_info_lines_and_ends_with_the_one_line(tmp_path):
    source = make_tiny_checkpoint(tmp_path / "ct", "llama", "ct-w4a4")
    case = next(case for case, _ in damage_corpus.tensor_damages(source, "llama")
                if case.label == "missing model.layers.1.mlp.up_proj.weight_scale")
    case.apply(source)
    expected = _inspect_message(source)
    script = ("from vllm import LLM\n"
              "if __name__ == '__main__':\n"
              f"    LLM(model={str(source)!r}, quantization='volta_nvfp4', dtype='float32', enforce_eager=True,"
              " max_model_len=256)\n")
    result = subprocess.run([sys.executable, "-c", script], env=CPU_ENGINE_ENV, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"vllm_volta_fp4.plugin.quantization.config.CheckpointRefused: volta_nvfp4 cannot serve this " \
                   f"checkpoint: {expected}", result.stderr[-3000:]
    assert "Loading safetensors" not in result.stderr  # refused before any weight was read
    # the plugin's INFO lines reach vLLM's log (stdout, vLLM's handler; our loggers live under its "vllm" hierarchy):
    # README's W4A4 line
    assert "volta_nvfp4: the checkpoint also quantizes activations (W4A4/W8A8); its input scales are read and " \
           "ignored" in result.stdout
