#!/usr/bin/env python3
"""Compile the kernels for Volta (compute_70 → sm_70) without a V100 and check the result.

CUDA 13 cannot target sm_70, so this uses CUDA 12.9's NVRTC and ptxas from PyPI
(``pip install nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86``):
csrc/gemm/weight_gemm.cuh → PTX (NVRTC, every kernel instantiation the extension launches) → sm_70 cubin (ptxas -v).
Fails when a kernel spills registers, needs more than Volta's 96 KB of shared memory per block, or when the PTX
lacks the Volta HMMA instruction (mma.sync.aligned.m8n8k4). Prints registers, spills and shared memory per kernel.

    python tools/sm70_check.py [--keep DIR]          # compile and check the kernels of csrc/
    python tools/sm70_check.py --build-image DIR     # write the wheel's kernel image (setup.py's extension build)
    python tools/sm70_check.py --wheel dist/X.whl    # check the kernels a wheel ships

The attention and Gated-DeltaNet kernels are compiled the same way (``attention_kernel_source``,
``gdn_kernel_source``, ``compile_family``: used by tests/ops/test_*sm70_compile.py and tools/sm70_resources.py).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import glob
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = "gemm/weight_gemm.cuh"
VOLTA_MAX_SMEM_PER_BLOCK = 96 * 1024
VOLTA_SMEM_PER_SM = 96 * 1024
VOLTA_RESERVED_SMEM_PER_BLOCK = 0  # the driver reserves none below compute capability 8.0
VOLTA_HMMA = "mma.sync.aligned.m8n8k4"
MMA_ATOMS = ("Sm70Mma", "Sm80Mma")
FORMATS = ("Nvfp4Format", "Fp8Format")
BLOCK_ROWS = (16, 32)  # the fused kernel's BM values (fused_block_rows in gemm/weight_gemm_plan.h)
GEMV_ROWS = tuple(range(1, 17))  # the M values of weight_gemv_kernel (PATH_GEMV, M <= kGemvMaxM)
ATTENTION_HEAD_SIZES = (64, 128, 256)
ATTENTION_BLOCK_ROWS = (64, 16)  # prefill and decode blocks (attention/attention_shape.h)
GDN_HEAD_DIMS = (64, 128)
GDN_STATE_TYPES = ("float", "uint16_t")  # the state cache in float32 or fp16
GDN_CONV_WIDTHS = (2, 3, 4)


class ToolchainMissing(RuntimeError):
    """The CUDA 12.9 NVRTC / ptxas wheels are not installed."""


def _package_dirs(name: str) -> list[Path]:
    """Install locations of an ``nvidia.<name>`` wheel on sys.path (namespace package, no __init__)."""
    found = []
    for entry in sys.path + [str(REPO / ".toolchain")]:
        candidate = Path(entry or ".") / "nvidia" / name
        if candidate.is_dir():
            found.append(candidate)
    return found


def find_toolchain() -> tuple[Path, Path]:
    """(libnvrtc.so.12, ptxas) from the nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvcc-cu12 wheels."""
    nvrtc = [Path(p) for d in _package_dirs("cuda_nvrtc") for p in glob.glob(str(d / "lib" / "libnvrtc.so.12"))]
    ptxas = [p for d in _package_dirs("cuda_nvcc") for p in [d / "bin" / "ptxas"] if p.is_file()]
    if not nvrtc or not ptxas:
        raise ToolchainMissing(
            "CUDA 12.9 NVRTC/ptxas not found; "
            "pip install nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86"
        )
    return nvrtc[0], ptxas[0]


def kernel_expressions() -> list[str]:
    """NVRTC name expressions of every kernel the wheel's host code launches (the kernel image), in the order of
    launched_kernel_names() in csrc/gemm/weight_gemm_plan.h, csrc/attention/attention_plan.h, then
    csrc/gdn/gdn_plan.h (tests/test_wheel.py checks that they agree)."""
    ns = "volta_fp4::"
    names = [f"{ns}weight_gemm_kernel<{ns}{a}, {ns}{f}, {r}>" for a in MMA_ATOMS for f in FORMATS for r in BLOCK_ROWS]
    names += [f"{ns}weight_gemv_kernel<{ns}{a}, {ns}{f}, {r}>" for a in MMA_ATOMS for f in FORMATS for r in GEMV_ROWS]
    names += [f"{ns}dequantize_tiles_kernel<{ns}{f}>" for f in FORMATS]
    ns_attention = f"{ns}attention::"
    names += [f"{ns_attention}paged_attention_kernel<{ns}{a}, {d}, {r}>"
              for a in MMA_ATOMS for d in ATTENTION_HEAD_SIZES for r in ATTENTION_BLOCK_ROWS]
    names += [f"{ns_attention}combine_splits_kernel<{d}>" for d in ATTENTION_HEAD_SIZES]
    names += [f"{ns_attention}write_kv_cache_kernel"]
    ns_gdn = f"{ns}gdn::"
    names += [f"{ns_gdn}row_norm_kernel<{d}, {gated}>" for d in GDN_HEAD_DIMS for gated in ("false", "true")]
    names += [f"{ns_gdn}causal_conv1d_kernel<{width}>" for width in GDN_CONV_WIDTHS]
    for atom in MMA_ATOMS:
        for d in GDN_HEAD_DIMS:
            names.append(f"{ns_gdn}chunk_prepare_kernel<{ns}{atom}, {d}>")
            names += [f"{ns_gdn}chunk_state_kernel<{ns}{atom}, {d}, {state}>" for state in GDN_STATE_TYPES]
    names += [f"{ns_gdn}recurrent_decode_kernel<{d}, {state}>" for d in GDN_HEAD_DIMS for state in GDN_STATE_TYPES]
    return names


# The headers of the kernel image's translation unit (the families the wheel's host code launches).
IMAGE_HEADERS = (HEADER, "attention/attention.cuh", "gdn/gdn.cuh")


# Each family's dynamic shared memory from its header's own formula, exported as __device__ ints so that the
# reports can read it from the PTX (ptxas does not know dynamic shared memory).
def gemm_smem_exports() -> list[str]:
    return [f"__device__ int fused_smem_bytes_bm{rows} = volta_fp4::fused_smem_bytes({rows});" for rows in BLOCK_ROWS]


def attention_smem_exports() -> list[str]:
    """The plan of each block, and what a V100 launch requests (decode blocks ask for more to cap residency)."""
    plans = [f"__device__ int attention_smem_bytes_d{d}_r{r} = volta_fp4::attention::attention_smem_bytes({d}, {r});"
             for d in ATTENTION_HEAD_SIZES for r in ATTENTION_BLOCK_ROWS]
    requests = [f"__device__ int attention_launch_smem_d{d}_r{r} = volta_fp4::attention::attention_launch_smem_bytes("
                f"{d}, {r}, {VOLTA_SMEM_PER_SM}, {VOLTA_RESERVED_SMEM_PER_BLOCK});"
                for d in ATTENTION_HEAD_SIZES for r in ATTENTION_BLOCK_ROWS]
    return plans + requests


def gdn_smem_exports() -> list[str]:
    return [f"__device__ int {kind.lower()}_smem_d{d} = volta_fp4::gdn::{kind}Smem<{d}>::kBytes;"
            for d in GDN_HEAD_DIMS for kind in ("Prepare", "State")]


def image_source() -> str:
    """The kernel image's translation unit: the families' headers (NVRTC name expressions instantiate the kernels)
    and their shared-memory exports."""
    lines = [f'#include "{header}"' for header in IMAGE_HEADERS]
    lines += gemm_smem_exports() + attention_smem_exports() + gdn_smem_exports()
    return "\n".join(lines) + "\n"


def kernel_source() -> str:
    """A translation unit that instantiates every GEMM kernel the extension launches."""
    lines = [f'#include "{HEADER}"', "namespace volta_fp4 {"]
    for atom in MMA_ATOMS:
        for fmt in FORMATS:
            for rows in BLOCK_ROWS:
                lines.append(f"template __global__ void weight_gemm_kernel<{atom}, {fmt}, {rows}>(const GemmParams);")
    for atom in MMA_ATOMS:
        for fmt in FORMATS:
            for rows in GEMV_ROWS:
                lines.append(f"template __global__ void weight_gemv_kernel<{atom}, {fmt}, {rows}>(const GemmParams);")
    for fmt in FORMATS:
        lines.append(
            f"template __global__ void dequantize_tiles_kernel<{fmt}>"
            "(const uint8_t*, const float*, uint16_t*, int, int, int, int);"
        )
    lines.append("}")
    return "\n".join(lines + gemm_smem_exports()) + "\n"


def attention_kernel_source() -> str:
    """Every attention kernel the extension launches on a Volta GPU (the SM70 atom only)."""
    lines = ['#include "attention/attention.cuh"', "namespace volta_fp4 { namespace attention {"]
    for d in ATTENTION_HEAD_SIZES:
        for r in ATTENTION_BLOCK_ROWS:
            lines.append(
                f"template __global__ void paged_attention_kernel<Sm70Mma, {d}, {r}>(const PagedAttentionParams);")
        lines.append(f"template __global__ void combine_splits_kernel<{d}>(const PagedAttentionParams);")
    lines.append("}}")
    return "\n".join(lines + attention_smem_exports()) + "\n"


def gdn_kernel_source() -> str:
    """Every GDN kernel the extension launches on a Volta GPU (the SM70 atom only)."""
    lines = ['#include "gdn/gdn.cuh"', "namespace volta_fp4 { namespace gdn {"]
    for d in GDN_HEAD_DIMS:
        lines.append(f"template __global__ void chunk_prepare_kernel<Sm70Mma, {d}>(const ChunkParams);")
        for state in GDN_STATE_TYPES:
            lines.append(f"template __global__ void chunk_state_kernel<Sm70Mma, {d}, {state}>(const ChunkParams);")
            lines.append(f"template __global__ void recurrent_decode_kernel<{d}, {state}>(const DecodeParams);")
        for gated in ("true", "false"):
            lines.append(f"template __global__ void row_norm_kernel<{d}, {gated}>(const RowNormParams);")
    for width in GDN_CONV_WIDTHS:
        lines.append(f"template __global__ void causal_conv1d_kernel<{width}>(const ConvParams);")
    lines.append("}}")
    return "\n".join(lines + gdn_smem_exports()) + "\n"


def attention_smem_table(ptx: str, export: str = "attention_smem_bytes") -> dict[tuple[int, int], int]:
    """{(head size, block rows): bytes} of one of attention_smem_exports' tables in the PTX: the header's SmemPlan
    (attention_smem_bytes) or a V100 launch's request (attention_launch_smem)."""
    return {(int(d), int(r)): int(v) for d, r, v in re.findall(rf"{export}_d(\d+)_r(\d+)\s*=\s*(\d+)", ptx)}


def attention_dynamic_smem(report: KernelReport, ptx: str) -> int:
    """paged_attention_kernel's dynamic shared memory as a V100 launch requests it (exported by the source): the
    residency it allows is the one the driver gets."""
    if "paged_attention_kernel" not in report.name:
        return report.dynamic_smem
    head_size, block_rows = re.search(r"ELi(\d+)ELi(\d+)EEEv", report.name).groups()
    return attention_smem_table(ptx, "attention_launch_smem")[int(head_size), int(block_rows)]


def gdn_dynamic_smem(report: KernelReport, ptx: str) -> int:
    """The chunked-prefill kernels' dynamic shared memory from the header's PrepareSmem / StateSmem."""
    smem = {f"{kind}{d}": int(v) for kind, d, v in re.findall(r"(prepare|state)_smem_d(\d+)\s*=\s*(\d+)", ptx)}
    for kind in ("prepare", "state"):
        if f"chunk_{kind}_kernel" in report.name:
            head_dim = re.search(r"Sm[78]0MmaELi(\d+)E", report.name).group(1)
            return smem[f"{kind}{head_dim}"]
    return report.dynamic_smem


def gdn_readable(mangled: str) -> str:
    kernel = re.search(r"gdn\d+(\w+?_kernel)", mangled).group(1)
    args = [a for a in MMA_ATOMS if a in mangled] + [f"{n}" for n in re.findall(r"Li(\d+)E", mangled)]
    if kernel.startswith(("chunk_state", "recurrent")):
        args.append("fp32 state" if re.search(r"EfEEv", mangled) else "fp16 state")
    if kernel == "row_norm_kernel":
        args.append("gated" if "Lb1E" in mangled else "l2")
    return f"{kernel}<{', '.join(args)}>"


def attention_readable(mangled: str) -> str:
    kernel = re.search(r"attention\d+(\w+?_kernel)", mangled).group(1)
    numbers = re.findall(r"Li(\d+)E", mangled)  # head size, then (paged attention) block rows
    args = [a for a in MMA_ATOMS if a in mangled]
    args += [f"{key}={n}" for key, n in zip(("D", "rows"), numbers, strict=False)]
    return f"{kernel}<{', '.join(args)}>" if args else kernel


def compile_family(source: str, dynamic_smem=None, keep: Path | None = None) -> tuple[str, list[KernelReport]]:
    """(PTX, ptxas reports) of one translation unit for sm_70, each report's dynamic shared memory filled in by
    ``dynamic_smem(report, ptx)`` (the weight GEMM's comes from ptxas_reports itself)."""
    libnvrtc, ptxas = find_toolchain()
    ptx = nvrtc_compile(libnvrtc, source)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        reports = ptxas_reports(ptxas, ptx, workdir)
    if dynamic_smem is not None:
        reports = [dataclasses.replace(r, dynamic_smem=dynamic_smem(r, ptx)) for r in reports]
    return ptx, reports


def nvrtc_compile(libnvrtc: Path, source: str, arch: str = "compute_70",
                  name_expressions: tuple[str, ...] = ()) -> str | tuple[str, dict[str, str]]:
    """CUDA C++ → PTX for ``arch``; raises with NVRTC's log on failure. With ``name_expressions``, also returns each
    expression's lowered (mangled) name: the kernel table of the wheel."""
    lib = ctypes.CDLL(str(libnvrtc))
    program = ctypes.c_void_p()

    def check(status: int, what: str) -> None:
        if status != 0:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(status).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"sm70_check.cu", 0, None, None), "create")
    for expression in name_expressions:
        check(lib.nvrtcAddNameExpression(program, expression.encode()), f"name expression {expression}")
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--use_fast_math", f"-I{REPO / 'csrc'}".encode()]
    status = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    log_size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    lib.nvrtcGetProgramLog(program, log)
    if status != 0:
        raise RuntimeError(f"NVRTC failed for {arch}:\n{log.value.decode()}")
    ptx_size = ctypes.c_size_t()
    check(lib.nvrtcGetPTXSize(program, ctypes.byref(ptx_size)), "PTX size")
    ptx = ctypes.create_string_buffer(ptx_size.value)
    check(lib.nvrtcGetPTX(program, ptx), "PTX")
    lowered = {}
    for expression in name_expressions:
        name = ctypes.c_char_p()
        check(lib.nvrtcGetLoweredName(program, expression.encode(), ctypes.byref(name)), f"lowered {expression}")
        lowered[expression] = name.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(program))
    return (ptx.value.decode(), lowered) if name_expressions else ptx.value.decode()


@dataclass
class KernelReport:
    name: str
    registers: int
    spill_bytes: int
    stack_bytes: int
    static_smem: int
    dynamic_smem: int
    threads: int = 0  # threads per block: the kernel's __launch_bounds__ (.maxntid in the PTX)
    ptx_mma: int = 0  # m8n8k4 mma.sync instructions in the kernel's PTX (static count: unrolled loop bodies)

    @property
    def problems(self) -> list[str]:
        found = []
        if self.spill_bytes:
            found.append(f"{self.spill_bytes} bytes of register spills")
        if self.static_smem + self.dynamic_smem > VOLTA_MAX_SMEM_PER_BLOCK:
            found.append(f"{self.static_smem + self.dynamic_smem} bytes of shared memory > 96 KB")
        return found


def ptx_entries(ptx: str) -> dict[str, tuple[int, int]]:
    """{kernel: (threads per block from .maxntid, or 0; m8n8k4 mma.sync count)} of every entry of the PTX."""
    entries = {}
    for chunk in re.split(r"\n(?=(?:\.visible |\.weak )?\.entry )", ptx):
        if name := re.match(r"(?:\.visible |\.weak )?\.entry (\w+)", chunk):
            threads = re.search(r"\.maxntid (\d+), (\d+), (\d+)", chunk)
            count = int(threads.group(1)) * int(threads.group(2)) * int(threads.group(3)) if threads else 0
            entries[name.group(1)] = (count, chunk.count(VOLTA_HMMA))
    return entries


def ptxas_reports(ptxas: Path, ptx: str, workdir: Path) -> list[KernelReport]:
    ptx_path = workdir / "kernels_sm70.ptx"
    ptx_path.write_text(ptx)
    result = subprocess.run(
        [str(ptxas), "-arch=sm_70", "-O3", "-v", str(ptx_path), "-o", str(workdir / "kernels_sm70.cubin")],
        capture_output=True, text=True,
    )
    if result.returncode:
        raise RuntimeError(f"ptxas failed for sm_70:\n{result.stderr}")
    smem_of_rows = {int(r): int(v) for r, v in re.findall(r"fused_smem_bytes_bm(\d+)\s*=\s*(\d+)", ptx)}
    entries = ptx_entries(ptx)
    reports, current = [], None
    for line in result.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = m.group(1)
        elif current and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                          line)):
            stack, spill_stores, spill_loads = map(int, m.groups())
            pending = (stack, spill_stores + spill_loads)
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            static_smem = int(s.group(1)) if (s := re.search(r"(\d+) bytes smem", line)) else 0
            rows = re.search(r"ELi(\d+)EEEv", current)
            dynamic = smem_of_rows.get(int(rows.group(1)), 0) if "weight_gemm_kernel" in current and rows else 0
            threads, mma = entries.get(current, (0, 0))
            reports.append(KernelReport(current, int(m.group(1)), pending[1], pending[0], static_smem, dynamic,
                                        threads, mma))
            current = None
    return reports


def readable(mangled: str) -> str:
    atom = next((a for a in MMA_ATOMS if a in mangled), "")
    fmt = next((f for f in FORMATS if f in mangled), "")
    rows = re.search(r"ELi(\d+)EEEv", mangled)
    if "weight_gemv_kernel" in mangled:
        return f"weight_gemv<{atom}, {fmt}, M={rows.group(1) if rows else '?'}>"
    kind = "weight_gemm" if "weight_gemm_kernel" in mangled else "dequantize_tiles"
    return f"{kind}<{', '.join(x for x in (atom, fmt, f'BM={rows.group(1)}' if rows else '') if x)}>"


def readable_any(mangled: str) -> str:
    """A readable name for a kernel of any family."""
    if "attention" in mangled:
        return attention_readable(mangled)
    if "gdn" in mangled:
        return gdn_readable(mangled)
    return readable(mangled)


def image_reports(ptxas: Path, ptx70: str, workdir: Path) -> list[KernelReport]:
    """ptxas -v of the image's compute_70 PTX, each kernel's dynamic shared memory filled in."""
    reports = ptxas_reports(ptxas, ptx70, workdir)
    return [dataclasses.replace(r, dynamic_smem=gdn_dynamic_smem(r, ptx70) if "gdn" in r.name else
                                attention_dynamic_smem(r, ptx70)) for r in reports]


def check(keep: Path | None = None) -> tuple[list[KernelReport], list[str]]:
    """Compile and check; returns the per-kernel reports and the list of failures (empty when clean)."""
    ptx, reports = compile_family(kernel_source(), keep=keep)
    failures = [f"{readable(r.name)}: {p}" for r in reports for p in r.problems]
    expected = len(MMA_ATOMS) * len(FORMATS) * (len(BLOCK_ROWS) + len(GEMV_ROWS)) + len(FORMATS)
    if len(reports) != expected:
        failures.append(f"ptxas reported {len(reports)} kernels, expected {expected}")
    if VOLTA_HMMA not in ptx:
        failures.append(f"the compute_70 PTX has no {VOLTA_HMMA} (Volta HMMA)")
    return reports, failures


# ─── The wheel's kernel image (vllm_volta_fp4/kernels/, loaded by csrc/driver/cuda_driver.cpp) ───────────────
IMAGE_CUBIN = "image.sm_70.cubin"  # machine code for compute capability 7.x
IMAGE_PTX70 = "image.compute_70.ptx"  # the cubin's PTX: kept so that the wheel's resources can be re-derived
IMAGE_PTX80 = "image.compute_80.ptx"  # JIT-compiled by the driver on compute capability >= 8.0 (m16n8k16 atom)
IMAGE_NAMES = "image.names.tsv"  # name expression \t lowered name, one kernel a line
IMAGE_DIR = "vllm_volta_fp4/kernels"


def build_image(out_dir: Path, expressions: list[str] | None = None) -> list[KernelReport]:
    """Compile the kernels (all of kernel_expressions(), or a subset) into out_dir's image files; returns the
    sm_70 ptxas report. Raises when a kernel has no sm_70 machine code."""
    libnvrtc, ptxas = find_toolchain()
    expressions = list(expressions or kernel_expressions())
    source = image_source()
    ptx70, lowered = nvrtc_compile(libnvrtc, source, "compute_70", tuple(expressions))
    ptx80, _ = nvrtc_compile(libnvrtc, source, "compute_80", tuple(expressions))
    out_dir.mkdir(parents=True, exist_ok=True)
    reports = image_reports(ptxas, ptx70, out_dir)
    (out_dir / "kernels_sm70.cubin").replace(out_dir / IMAGE_CUBIN)
    (out_dir / "kernels_sm70.ptx").replace(out_dir / IMAGE_PTX70)
    (out_dir / IMAGE_PTX80).write_text(ptx80)
    (out_dir / IMAGE_NAMES).write_text("".join(f"{e}\t{lowered[e]}\n" for e in expressions))
    missing = cubin_missing(out_dir / IMAGE_CUBIN, lowered.values())
    if missing:
        raise RuntimeError(f"no sm_70 machine code for {missing}")
    return reports


def cubin_missing(cubin: Path, lowered_names) -> list[str]:
    """The kernels without a .text section (machine code) in the cubin's ELF section names."""
    data = cubin.read_bytes()
    if not data.startswith(b"\x7fELF"):
        return list(lowered_names)
    return [name for name in lowered_names if f".text.{name}\0".encode() not in data]


def check_wheel(wheel: Path) -> tuple[list[KernelReport], list[str]]:
    """The wheel's kernel table against the host code's kernels, sm_70 machine code for each, and the sm_70
    resources (ptxas -v on the wheel's own compute_70 PTX)."""
    import zipfile

    _, ptxas = find_toolchain()
    failures = []
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        members = {Path(n).name: n for n in archive.namelist() if n.startswith(IMAGE_DIR + "/")}
        for needed in (IMAGE_CUBIN, IMAGE_PTX70, IMAGE_PTX80, IMAGE_NAMES):
            if needed not in members:
                return [], [f"{wheel.name} has no {IMAGE_DIR}/{needed}"]
        if not any(n.startswith("vllm_volta_fp4/_C") and n.endswith(".so") for n in archive.namelist()):
            failures.append(f"{wheel.name} has no vllm_volta_fp4/_C*.so")
        work = Path(tmp)
        for name, member in members.items():
            (work / name).write_bytes(archive.read(member))
        table = dict(line.split("\t") for line in (work / IMAGE_NAMES).read_text().splitlines() if line)
        if sorted(table) != sorted(kernel_expressions()):
            failures.append("the wheel's kernel table differs from the kernels the host code launches")
        failures += [f"{e}: no sm_70 machine code" for e in cubin_missing(work / IMAGE_CUBIN, table.values())
                     for e in [next(k for k, v in table.items() if v == e)]]
        reports = image_reports(ptxas, (work / IMAGE_PTX70).read_text(), work)
    failures += [f"{readable_any(r.name)}: {p}" for r in reports for p in r.problems]
    shipped = set(table.values())
    failures += [f"{r.name}: in the PTX but not in the kernel table" for r in reports if r.name not in shipped]
    return reports, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the PTX and cubin into this directory")
    parser.add_argument("--wheel", type=Path, help="check the kernels shipped in this wheel instead")
    parser.add_argument("--build-image", type=Path, metavar="DIR", help="write the wheel's kernel image into DIR")
    args = parser.parse_args()
    try:
        if args.build_image:
            reports, failures = build_image(args.build_image), []
        elif args.wheel:
            reports, failures = check_wheel(args.wheel)
        else:
            reports, failures = check(args.keep)
    except ToolchainMissing as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{'kernel (sm_70)':<48} {'regs':>5} {'spill B':>8} {'stack B':>8} {'smem B':>8}")
    for r in reports:
        smem = r.static_smem + r.dynamic_smem
        print(f"{readable_any(r.name):<48} {r.registers:>5} {r.spill_bytes:>8} {r.stack_bytes:>8} {smem:>8}")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    print("sm_70 check:", "FAILED" if failures else f"clean ({VOLTA_HMMA} present in PTX)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
