"""Build script. The package is pure Python; the CUDA extension ``vllm_volta_fp4._C`` is added only where it can
be built: torch with CUDA importable in the build environment and nvcc present. Override with
VLLM_VOLTA_FP4_BUILD_EXT=1 (build or fail) / =0 (never build). Build the extension with
``pip install --no-build-isolation .`` so the build sees your CUDA torch; TORCH_CUDA_ARCH_LIST defaults to 7.0."""

import glob
import importlib.util
import os
import shutil
import sys

from setuptools import setup


def _envs():
    """vllm_volta_fp4/envs.py, the one reader of VLLM_VOLTA_FP4_* (standard library only, so loadable by path)."""
    spec = importlib.util.spec_from_file_location("vllm_volta_fp4_envs", os.path.join("vllm_volta_fp4", "envs.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _say(message: str) -> None:
    print(f"vllm-volta-fp4 build: {message}", file=sys.stderr)


def _why_extension_cannot_build() -> str | None:
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return "torch is not importable in the build environment (use pip's --no-build-isolation)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    if not (CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))) and not shutil.which("nvcc"):
        return "nvcc not found (set CUDA_HOME)"
    if not glob.glob("csrc/**/*.cu", recursive=True):
        return "no CUDA sources in csrc/"
    return None


def _extensions() -> tuple[list, dict]:
    forced = _envs().build_extension()
    if forced is False:
        _say("building pure Python, without the CUDA extension: VLLM_VOLTA_FP4_BUILD_EXT=0")
        return [], {}
    obstacle = _why_extension_cannot_build()
    if obstacle and forced:
        raise RuntimeError(f"VLLM_VOLTA_FP4_BUILD_EXT=1 but the CUDA extension cannot be built: {obstacle}")
    if obstacle:
        _say(f"building pure Python, without the CUDA extension: {obstacle}")
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "7.0")
    _say(
        f"building the CUDA extension for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} "
        f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
    )
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True))
    extension = CUDAExtension(
        name="vllm_volta_fp4._C",
        sources=sources,
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={"cxx": ["-O3", "-std=c++17"],
                            "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo"]},
    )
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
