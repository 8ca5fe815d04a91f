"""The NVFP4 / FP8 formats and checkpoint recognition and validation: no vLLM, no CUDA."""
