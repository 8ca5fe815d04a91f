"""``volta-fp4 convert --device cuda`` writes exactly the files the CPU conversion writes (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint
from vllm_volta_fp4.toolkit.convert import convert_to_dense

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("fmt", ["ct-w4a16", "modelopt-mixed"])
def test_gpu_conversion_equals_cpu_conversion(tmp_path, fmt):
    source = make_tiny_checkpoint(tmp_path / "nvfp4", "llama", fmt)
    on_cpu = convert_to_dense(source, tmp_path / "cpu")
    on_gpu = convert_to_dense(source, tmp_path / "gpu", device="cuda")
    cpu_tensors = {k: v for f in sorted(on_cpu.glob("*.safetensors")) for k, v in load_file(f).items()}
    gpu_tensors = {k: v for f in sorted(on_gpu.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert cpu_tensors.keys() == gpu_tensors.keys()
    for name, tensor in cpu_tensors.items():
        assert torch.equal(tensor, gpu_tensors[name]), name
