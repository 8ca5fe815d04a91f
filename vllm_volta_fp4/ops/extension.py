"""Loading of the CUDA extension ``vllm_volta_fp4._C`` (ops under ``torch.ops.volta_fp4``) and what every family
of its ops shares: presence, fake (meta) implementations for torch.compile, and the MMA atom choice.

``mma``: 0 = by compute capability (7.x → Volta m8n8k4, ≥ 8.0 → m16n8k16), 70 or 80 to force one; the
environment variable VLLM_VOLTA_FP4_MMA=sm70|sm80 sets the default (the H200 runs the Volta path that way).
"""

from __future__ import annotations

import functools

import torch

from vllm_volta_fp4 import envs


@functools.cache
def _extension_loaded() -> bool:
    try:
        import vllm_volta_fp4._C  # noqa: F401  (registers torch.ops.volta_fp4)
    except ImportError:
        return False
    return True


class OpFamily:
    """One family of extension ops (GEMMs, attention, Gated DeltaNet): present when the extension was built with
    its ``probe`` op; its fake implementations are registered on first use."""

    def __init__(self, probe: str, register_fakes):
        self.probe = probe
        self._register_fakes = register_fakes

    @functools.cached_property
    def loaded(self) -> bool:
        if not _extension_loaded() or not hasattr(torch.ops.volta_fp4, self.probe):
            return False
        self._register_fakes()
        return True

    def available(self) -> bool:
        """The ops exist and a CUDA device is usable."""
        return self.loaded and torch.cuda.is_available()

    def runs_on(self, *tensors: torch.Tensor) -> bool:
        """The kernels should take these tensors: all on CUDA, ops present (else the reference runs)."""
        return all(t.is_cuda for t in tensors) and self.loaded


def default_mma() -> int:
    return envs.mma_atom()
