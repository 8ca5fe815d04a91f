"""volta-fp4 doctor: the real probe on this GPU-less machine, every V100 failure mode from synthetic facts, and
the model-directory checks (format, shards, sha256 manifest, layers, dtype, memory)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from vllm_volta_fp4.cli import main
from vllm_volta_fp4.format.checkpoint import Checkpoint
from vllm_volta_fp4.toolkit.doctor import (
    FAIL,
    OK,
    SKIP,
    WARN,
    Environment,
    GpuDevice,
    check_model,
    diagnose,
    format_report,
    probe_environment,
    run_doctor,
)

GIB = 2**30


def healthy_v100() -> Environment:
    """What a correctly set-up V100 server reports."""
    return Environment(
        nvml="ok", driver_version="570.133.20", driver_cuda=(12, 8),
        gpus=[GpuDevice("Tesla V100-SXM2-32GB", (7, 0), 32 * GIB, 31 * GIB)],
        torch_version="2.10.0+cu128", torch_cuda="12.8", torch_arch_list=["sm_70", "sm_75", "sm_80", "sm_90"],
        vllm_version="0.19.1", vllm_distribution="vllm", extension_path="/site/vllm_volta_fp4/_C.so",
        extension_code={"sm_70"}, plugin_registered=True, platform_plugin_registered=True, triton_installed=True)


def by_check(findings):
    table = {}
    for finding in findings:
        table.setdefault(finding.check, finding)
    return table


def test_healthy_v100_has_nothing_blocking():
    findings = diagnose(healthy_v100())
    assert [f for f in findings if f.status == FAIL] == []
    assert by_check(findings)["attention"].status == OK and "VOLTA_HMMA" in by_check(findings)["attention"].detail
    assert by_check(findings)["gpu"].status == OK and "Tesla V100" in by_check(findings)["gpu"].detail
    assert "ready to serve" in format_report(findings)


# (facts changed from the healthy V100, the check that must fail or warn, its status, words the line must say)
SCENARIOS = {
    "nvml-mismatch": ({"nvml": "mismatch", "gpus": [], "driver_cuda": None}, "gpu", FAIL, "reboot"),
    "torch-cu130": ({"torch_version": "2.11.0+cu130", "torch_cuda": "13.0",
                     "torch_arch_list": ["sm_75", "sm_80", "sm_90", "sm_100"]}, "torch-arch", FAIL,
                    "no kernel image is available"),
    "torch-ptx-only": ({"torch_arch_list": ["sm_80", "compute_60"]}, "torch-arch", WARN, "PTX"),
    "torch-cpu": ({"torch_version": "2.13.0+cpu", "torch_cuda": None, "torch_arch_list": []}, "torch", FAIL,
                  "CPU build"),
    "driver-too-old": ({"driver_cuda": (11, 8)}, "driver", FAIL, "too old"),
    "driver-minor-behind": ({"driver_cuda": (12, 2)}, "driver", WARN, "minor-version compatibility"),
    "vllm-missing": ({"vllm_version": None, "vllm_distribution": None}, "vllm", FAIL, "not installed"),
    "vllm-too-new": ({"vllm_version": "0.32.0"}, "vllm", FAIL, "sm_70"),
    "plugin-missing": ({"plugin_registered": False}, "plugin", FAIL, "modelopt_fp4 requires capability 75"),
    "plugin-filtered": ({"vllm_plugins_env": "lora_filesystem_resolver"}, "plugin", FAIL, "VLLM_PLUGINS"),
    "extension-missing": ({"extension_path": None, "extension_code": set()}, "extension", WARN, "not built"),
    "extension-no-sm70": ({"extension_code": {"sm_80", "sm_90"}}, "extension", FAIL, "no sm_70 code"),
    "extension-broken": ({"extension_error": "undefined symbol: _ZN3c10"}, "extension", WARN, "does not load"),
    "no-triton": ({"triton_installed": False, "attention_switch": "off"}, "attention", FAIL, "TRITON_ATTN"),
    "attention-switched-off": ({"attention_switch": "off"}, "attention", WARN, "VLLM_VOLTA_FP4_ATTENTION=0"),
    "attention-switch-invalid": ({"attention_switch": "invalid: VLLM_VOLTA_FP4_ATTENTION='x': expected …"}, "attention",
                                 FAIL, "VLLM_VOLTA_FP4_ATTENTION='x'"),
    "no-platform-plugin": ({"platform_plugin_registered": False}, "attention", WARN, "volta_attention"),
    "attention-without-extension": ({"extension_path": None, "extension_code": set()}, "attention", WARN,
                                    "pure-PyTorch reference"),
    "memory-in-use": ({"gpus": [GpuDevice("Tesla V100-SXM2-32GB", (7, 0), 32 * GIB, 20 * GIB)]}, "gpu-memory",
                      WARN, "below 0.6"),
    "pascal": ({"gpus": [GpuDevice("Tesla P100", (6, 0), 16 * GIB, 16 * GIB)]}, "gpu", FAIL, "7.0"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_failure_mode_is_named_with_a_fix(scenario):
    changes, check, status, words = SCENARIOS[scenario]
    findings = diagnose(dataclasses.replace(healthy_v100(), **changes))
    finding = by_check(findings)[check]
    assert finding.status == status, finding
    assert words in finding.detail + finding.fix
    assert finding.fix, "a failing or warning line must say what to do"
    if status == FAIL:
        assert "block serving" in format_report(findings)


def test_this_gpu_less_machine_says_so_and_exits_non_zero(capsys):
    if torch.cuda.is_available():
        pytest.skip("this test describes a machine without a GPU")
    env = probe_environment()
    assert env.gpus == [] and env.nvml != "ok"
    assert main(["doctor"]) == 1
    report = capsys.readouterr().out
    assert "no NVIDIA GPU" in report and "verdict:" in report.splitlines()[-1]
    for line in report.splitlines():
        if line.startswith(f"[{FAIL}]") or line.startswith(f"[{WARN}]"):
            assert "fix:" in line, line
    assert by_check(diagnose(env))["attention"].status == SKIP


def _write_manifest(model_dir, path):
    lines = [f"{hashlib.sha256(file.read_bytes()).hexdigest()}  {file.name}"
             for file in sorted(model_dir.glob("*.safetensors"))]
    path.write_text("\n".join(lines) + "\n")


def test_model_checks_on_a_good_checkpoint(tiny_checkpoints, tmp_path):
    model_dir = tiny_checkpoints["modelopt-mixed"]
    manifest = tmp_path / "SHA256SUMS"
    _write_manifest(model_dir, manifest)
    findings = by_check(check_model(model_dir, manifest))
    assert all(finding.status == OK for finding in findings.values()), findings
    kinds = [scheme.kind for scheme in Checkpoint(model_dir).validate().values()]
    layers = findings["model-layers"].detail
    assert f"{kinds.count('nvfp4')} NVFP4" in layers and f"{kinds.count('fp8')} FP8" in layers
    assert f"{kinds.count('unquantized')} fp16" in layers
    assert f"{len(list(model_dir.glob('*.safetensors')))} files match" in findings["model-sha256"].detail


def test_a_changed_file_fails_the_manifest(fresh_checkpoint, tmp_path):
    model_dir = fresh_checkpoint()
    manifest = tmp_path / "SHA256SUMS"
    _write_manifest(model_dir, manifest)
    shard = sorted(model_dir.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last weight: headers still valid, only the checksum can tell
    shard.write_bytes(bytes(data))
    finding = by_check(check_model(model_dir, manifest))["model-sha256"]
    assert finding.status == FAIL and f"{shard.name} differs" in finding.detail


def test_a_missing_shard_is_named(fresh_checkpoint):
    model_dir = fresh_checkpoint()
    shard = sorted(model_dir.glob("*.safetensors"))[0]
    shard.unlink()
    finding = by_check(check_model(model_dir))["model"]
    assert finding.status == FAIL and shard.name in finding.detail and "download" in finding.fix


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])  # current transformers writes dtype, older torch_dtype
def test_bf16_checkpoint_on_a_v100_asks_for_half(fresh_checkpoint, key):
    model_dir = fresh_checkpoint()
    config = {k: v for k, v in json.loads((model_dir / "config.json").read_text()).items() if k != "torch_dtype"}
    (model_dir / "config.json").write_text(json.dumps({**config, key: "bfloat16"}))
    findings = by_check(check_model(model_dir, capability=(7, 0)))
    assert findings["model-dtype"].status == WARN and "--dtype half" in findings["model-dtype"].fix
    assert "bf16 (unquantized)" in findings["model-layers"].detail and "fp16" not in findings["model-layers"].detail
    assert by_check(check_model(model_dir, capability=(8, 0)))["model-dtype"].status == OK


def test_weights_larger_than_free_memory_block_serving(tiny_checkpoints):
    model_dir = tiny_checkpoints["ct-w4a16"]
    tiny_free = dataclasses.replace(healthy_v100(), gpus=[GpuDevice("Tesla V100-SXM2-16GB", (7, 0), 16 * GIB, 4096)])
    finding = by_check(run_doctor(model_dir, env=tiny_free))["model-memory"]
    assert finding.status == FAIL and "out of memory" in finding.detail
    assert by_check(run_doctor(model_dir, env=healthy_v100()))["model-memory"].status == OK


def test_cli_reports_a_broken_model_directory(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert main(["doctor", str(tmp_path)]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "] model " in line)
    assert FAIL in line and "quantization_config" in line
