"""The ``volta_nvfp4`` quantization config and its weight-only linear methods (NVFP4 → W4A16, FP8 → W8A16)."""
