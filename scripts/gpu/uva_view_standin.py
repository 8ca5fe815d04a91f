"""GPU-kit plumbing (not the product): a pure-torch stand-in for vLLM's ``torch.ops._C.get_cuda_view_from_cpu_tensor``,
which vLLM's CPU offload (``cpu_offload_gb``) calls to map pinned host memory into the GPU's address space (UVA).
The kit's vllm._C stub lacks it. Run before the engine starts (benchmarks/full_depth_e2e.py --preload THIS_FILE);
a real vllm._C that has the op keeps its own.

The view: pinned host memory allocated by CUDA is addressable from the device at the same pointer under unified
virtual addressing, so a CUDA tensor over that pointer (``__cuda_array_interface__``) reads host memory over PCIe.
The view keeps its host tensor alive."""

import torch

_TYPESTR = {torch.float16: "<f2", torch.float32: "<f4", torch.float64: "<f8", torch.int8: "|i1", torch.uint8: "|u1",
            torch.int32: "<i4", torch.int64: "<i8", torch.bool: "|b1"}
_KEEP_ALIVE = []


class _HostMemory:
    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape), "typestr": _TYPESTR[tensor.dtype], "version": 3,
            "data": (tensor.data_ptr(), False),
            "strides": tuple(s * tensor.element_size() for s in tensor.stride()) if tensor.dim() else None}


def cuda_view_of_pinned(cpu_tensor: torch.Tensor) -> torch.Tensor:
    if not cpu_tensor.is_pinned():
        raise ValueError("get_cuda_view_from_cpu_tensor needs pinned host memory")
    holder = _HostMemory(cpu_tensor)
    _KEEP_ALIVE.append(holder)
    return torch.as_tensor(holder, device="cuda")


def install() -> bool:
    """Register the op unless vLLM's compiled extension already has it; True if registered here."""
    if hasattr(torch.ops._C, "get_cuda_view_from_cpu_tensor"):
        return False
    library = torch.library.Library("_C", "FRAGMENT")
    library.define("get_cuda_view_from_cpu_tensor(Tensor cpu_tensor) -> Tensor")
    library.impl("get_cuda_view_from_cpu_tensor", cuda_view_of_pinned, "CPU")
    _KEEP_ALIVE.append(library)
    return True


if __name__ in ("__main__", "<run_path>"):
    import vllm._C  # noqa: F401 — the kit's stub registers its own _C ops first

    print("uva_view_standin:", "registered" if install() else "vllm._C has the op")
    if torch.cuda.is_available():  # a self-check: the view reads the host values
        host = torch.arange(8, dtype=torch.float16).pin_memory()
        assert torch.equal(torch.ops._C.get_cuda_view_from_cpu_tensor(host).cpu(), host)
