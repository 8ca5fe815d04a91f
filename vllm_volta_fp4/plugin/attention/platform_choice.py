"""The ``vllm.platform_plugins`` entry point that makes vLLM pick the VOLTA_HMMA attention backend by default.

Kept apart from the backend on purpose: vLLM calls it while it resolves its platform, i.e. in the middle of
importing vLLM itself, so this module imports nothing from vLLM at import time (a cycle would otherwise leave the
backend module half-initialised in every process that loads the plugin, tensor-parallel workers first).

``VLLM_VOLTA_FP4_ATTENTION`` (vllm_volta_fp4.envs): unset or 1 → our platform on compute capability 7.x only;
0 → never; ``force`` → on any CUDA GPU (how the end-to-end tests check the automatic choice on a non-Volta GPU);
anything else stops vLLM with an error."""

from __future__ import annotations

from vllm_volta_fp4 import envs

ENABLE_ENV = envs.ATTENTION.name
PLATFORM = "vllm_volta_fp4.plugin.attention.platform.VoltaCudaPlatform"


def automatic_choice() -> str:
    """``off``, ``volta`` (default: compute capability 7.x only) or ``force`` (any CUDA GPU), from ENABLE_ENV."""
    return envs.attention_choice()


def _cuda_capability_major() -> int | None:
    """Compute capability major of GPU 0 through NVML (does not initialise CUDA in this process)."""
    try:
        from vllm.third_party import pynvml  # vLLM's vendored copy: the pynvml package may be absent

        pynvml.nvmlInit()
        try:
            major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        return int(major)
    except Exception:  # no NVML, no driver, no GPU: not our platform
        return None


def volta_platform() -> str | None:
    """``vllm.platform_plugins`` entry point: our CUDA platform on compute capability 7.x (or any CUDA GPU when
    forced), else None so that vLLM's own platform detection decides."""
    choice = automatic_choice()
    major = None if choice == "off" else _cuda_capability_major()
    if major is None or (major != 7 and choice != "force"):
        return None
    return PLATFORM
