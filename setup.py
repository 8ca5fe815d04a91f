"""Build script. The package is pure Python; the CUDA extension ``vllm_volta_fp4._C`` is built only with
VLLM_VOLTA_FP4_BUILD_EXT=1 (tools/build_wheel.sh, which installs what the build needs): no CUDA compiler, every
kernel compiled by NVRTC + ptxas 12.x (PyPI) into the kernel image the wheel ships, host code built by the C++
compiler against torch's stable ABI headers (VLLM_VOLTA_FP4_TORCH_INCLUDE, else the build environment's torch)."""

import glob
import importlib.util
import os
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


def _sm70_check():
    """tools/sm70_check.py, the kernel-image compiler (NVRTC + ptxas), which the sdist carries."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
    import sm70_check

    return sm70_check


def _why_extension_cannot_build(torch_include: str | None) -> str | None:
    """Why the extension cannot be built here, checked before any compilation; None when it can."""
    if torch_include is None:
        return ("no torch headers: set VLLM_VOLTA_FP4_TORCH_INCLUDE to a torch >= 2.10 include directory or build "
                "with torch installed (pip's --no-build-isolation); tools/build_wheel.sh does both")
    if not os.path.isfile(os.path.join(torch_include, "torch", "csrc", "stable", "library.h")):
        return f"{torch_include} has no torch/csrc/stable/library.h (torch >= 2.10's headers are needed)"
    sm70_check = _sm70_check()
    try:
        sm70_check.find_toolchain()
    except sm70_check.ToolchainMissing as error:
        return str(error)
    return None


def _torch_include() -> str | None:
    include = _envs().torch_include()
    if include:
        return include
    try:
        import torch.utils.cpp_extension
    except ImportError:
        return None
    return torch.utils.cpp_extension.include_paths()[0]


def _extension(torch_include: str) -> tuple[list, dict]:
    """Every kernel (GEMM, attention, GDN) compiled by NVRTC + ptxas into vllm_volta_fp4/kernels/ (sm_70 cubin,
    compute_80 PTX), loaded and launched through the CUDA driver API by host code csrc/driver/*.cpp, which the C++
    compiler builds against torch's stable ABI. libtorch_cpu is linked by name only (a stub at link time): the
    process's torch provides it at run time, so one binary serves every torch >= 2.10."""
    import subprocess
    import sysconfig

    from setuptools import Extension
    from setuptools.command.build_py import build_py

    class BuildPyWithKernelImage(build_py):
        """build_py that first compiles the kernel image it ships as package data (vllm_volta_fp4/kernels/*): in a
        command, not at import, so that the setup.py runs that only ask for metadata compile nothing."""

        def run(self):
            sm70_check = _sm70_check()
            _say("compiling the kernel image with NVRTC + ptxas (sm_70 cubin, compute_80 PTX)")
            reports = sm70_check.build_image(sm70_check.REPO / sm70_check.IMAGE_DIR)
            _say(f"{len(reports)} kernels, sm_70 machine code for each")
            super().run()

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
    if not _envs().build_extension():
        _say("building pure Python, without the CUDA extension (VLLM_VOLTA_FP4_BUILD_EXT=1 builds it: "
             "bash tools/build_wheel.sh)")
        return [], {}
    torch_include = _torch_include()
    obstacle = _why_extension_cannot_build(torch_include)
    if obstacle:
        raise RuntimeError(f"VLLM_VOLTA_FP4_BUILD_EXT=1 but the CUDA extension cannot be built: {obstacle}")
    return _extension(torch_include)


ext_modules, cmdclass = _extensions()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    package_data={"vllm_volta_fp4": ["kernels/*"]} if ext_modules else {},
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if ext_modules else {},
)
