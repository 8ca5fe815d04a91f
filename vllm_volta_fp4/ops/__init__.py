"""Python faces of the CUDA kernels (``vllm_volta_fp4._C``, ops under ``torch.ops.volta_fp4``), each with the
pure-PyTorch reference that is the CPU fallback and the test oracle."""
