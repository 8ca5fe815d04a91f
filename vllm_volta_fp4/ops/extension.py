"""Loading of the CUDA extension ``vllm_volta_fp4._C`` (ops under ``torch.ops.volta_fp4``) and what every family
of its ops shares: presence, fake (meta) implementations for torch.compile, and the MMA atom choice.

Everything here is decided once, when this module is imported (the plugin's registration imports it, in every vLLM
process, before vLLM traces the model): whether the extension loaded, which op families it has, their fake
implementations, and the MMA atom. The ops' Python faces then read plain module values, which torch.compile
(Dynamo, ``fullgraph=True`` in vLLM) treats as constants; nothing they run inside a traced forward imports,
registers, caches or reads the environment.

``MMA``: 0 = by compute capability (7.x → Volta m8n8k4, ≥ 8.0 → m16n8k16), 70 or 80 to force one; the environment
variable VLLM_VOLTA_FP4_MMA=sm70|sm80 sets it at start-up (the H200 runs the Volta path that way).
"""

from __future__ import annotations

import torch

from vllm_volta_fp4 import envs


def _import_extension() -> bool:
    try:
        import vllm_volta_fp4._C  # noqa: F401  (registers torch.ops.volta_fp4)
    except ImportError:
        return False
    return True


LOADED: bool = _import_extension()
"""vllm_volta_fp4._C imported (its ops are registered under torch.ops.volta_fp4)."""

MMA: int = envs.mma_atom()
"""The MMA atom the ops use unless a call names one (VLLM_VOLTA_FP4_MMA, read at start-up)."""


class OpFamily:
    """One family of extension ops (GEMMs, attention, Gated DeltaNet): present when the extension was built with
    its ``probe`` op. The module that defines the family calls ``on_load`` once, at its import, with what must
    happen before the ops are used (fake implementations, settings)."""

    def __init__(self, probe: str):
        self.probe = probe
        self.loaded: bool = LOADED and hasattr(torch.ops.volta_fp4, probe)

    def on_load(self, setup) -> None:
        if self.loaded:
            setup()

    def available(self) -> bool:
        """The ops exist and a CUDA device is usable. Queries CUDA: call it outside traced code (the faces of the
        ops decide per call with ``runs_on``)."""
        return self.loaded and torch.cuda.is_available()

    def runs_on(self, *tensors: torch.Tensor) -> bool:
        """The kernels should take these tensors: ops present, all tensors on CUDA (else the reference runs)."""
        return self.loaded and all(t.is_cuda for t in tensors)


def default_mma() -> int:
    return MMA
