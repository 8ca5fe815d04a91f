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


def _driver_extension() -> tuple[list, dict]:
    """The extension without nvcc (VLLM_VOLTA_FP4_DRIVER_BUILD=1, tools/build_wheel.sh): every kernel (GEMM,
    attention, GDN) compiled by NVRTC + ptxas into vllm_volta_fp4/kernels/ (sm_70 cubin, compute_80 PTX), host code
    csrc/driver/*.cpp built by the C++ compiler against torch's stable ABI (headers from
    VLLM_VOLTA_FP4_TORCH_INCLUDE or the build environment's torch). libtorch_cpu is linked by name only (a stub at
    link time): the process's torch provides it at run time, so one binary serves every torch >= 2.10."""
    import subprocess
    import sysconfig

    from setuptools import Extension
    from setuptools.command.build_py import build_py

    class BuildPyWithKernelImage(build_py):
        """build_py that first compiles the kernel image it ships as package data (vllm_volta_fp4/kernels/*): in a
        command, not at import, so that the setup.py runs that only ask for metadata compile nothing."""

        def run(self):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
            import sm70_check

            _say("driver build: compiling the kernel image with NVRTC + ptxas (sm_70 cubin, compute_80 PTX)")
            reports = sm70_check.build_image(sm70_check.REPO / sm70_check.IMAGE_DIR)
            _say(f"driver build: {len(reports)} kernels, sm_70 machine code for each")
            super().run()

    torch_include = os.environ.get("VLLM_VOLTA_FP4_TORCH_INCLUDE")
    if not torch_include:
        import torch.utils.cpp_extension

        torch_include = torch.utils.cpp_extension.include_paths()[0]
    stub_dir = os.path.abspath(os.path.join("build", "torch_stub"))
    os.makedirs(stub_dir, exist_ok=True)
    stub_source = os.path.join(stub_dir, "empty.c")
    open(stub_source, "w").close()
    compiler = sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc"
    subprocess.run([compiler, "-shared", "-o", os.path.join(stub_dir, "libtorch_cpu.so"),
                    "-Wl,-soname,libtorch_cpu.so", stub_source], check=True)
    extension = Extension(
        name="vllm_volta_fp4._C",
        sources=sorted(glob.glob("csrc/driver/*.cpp")),
        include_dirs=[os.path.abspath("csrc"), torch_include],
        define_macros=[("TORCH_TARGET_VERSION", "0x020a000000000000")],  # torch 2.10's stable ABI
        extra_compile_args=["-O2", "-std=c++17"],
        libraries=["dl"],
        # --no-as-needed before -ltorch_cpu: the stub defines nothing, and the linker would otherwise drop it.
        extra_link_args=["-Wl,--no-as-needed", f"-L{stub_dir}", "-ltorch_cpu", "-Wl,--as-needed",
                         "-Wl,--allow-shlib-undefined", "-Wl,-rpath,$ORIGIN/../torch/lib"],
        py_limited_api=True,
    )
    return [extension], {"build_py": BuildPyWithKernelImage}


def _extensions() -> tuple[list, dict]:
    if _envs().driver_build():
        return _driver_extension()
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
    # csrc/driver/ is the other build's host code (its own module init): never in the same library.
    candidates = glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True)
    sources = sorted(path for path in candidates if not path.startswith(os.path.join("csrc", "driver", "")))
    extension = CUDAExtension(
        name="vllm_volta_fp4._C",
        sources=sources,
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={"cxx": ["-O3", "-std=c++17"],
                            "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo"]},
    )
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
driver = _envs().driver_build()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    package_data={"vllm_volta_fp4": ["kernels/*"]} if driver else {},
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if driver else {},
)
