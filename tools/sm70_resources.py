#!/usr/bin/env python3
"""Per-kernel sm_70 resources of every Volta variant, and a V100 time MODEL per kernel at Qwen3.8-27B shapes.

Compiles the GEMM, attention and Gated-DeltaNet kernels for sm_70 through tools/sm70_check.py (CUDA 12.9 NVRTC +
ptxas from PyPI) and writes a markdown report: registers, spills, static + dynamic shared memory, threads per block
(__launch_bounds__), resident blocks / warps per SM on a V100 and what limits them, the m8n8k4 mma.sync count of
the PTX (static: unrolled loop bodies) and per unit of work (derived from the kernels' tile loops), then an
estimate per kernel call at the real model's shapes: max(bytes / 870 GB/s, m8n8k4 count / V100 tensor rate).
The estimate is a model (no V100 ran it); devkit/v100.py says how the tensor rate follows from 125 TFLOP/s.
The SM80-atom instantiations are left out: the host never launches them below compute capability 8.0.

    python tools/sm70_resources.py [--out benchmarks/results/sm70-resources.md] [--commit HASH]
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

import sm70_check  # noqa: E402

from devkit import v100  # noqa: E402
from vllm_volta_fp4.toolkit.planner import model_shape, read_config  # noqa: E402

CONFIG = REPO / "tests" / "data" / "qwen3.8-27b-config.json"
GEMM_TILE_N = 64  # weight_gemm.cuh: weight tiles of 64 rows × 128 columns
GEMM_BLOCK_ROWS = 32  # the fused kernel's largest BM (kFusedMaxBlockRows)
ATTENTION_TILE_KEYS = 64
GDN_CHUNK, GDN_V_SLICE = 64, 32
NVFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 16  # 4-bit code + one E4M3 scale per 16 (4.5 bits)
FP8_BYTES_PER_WEIGHT = 1.0
FP16 = 2


@dataclass(frozen=True)
class Call:
    """One kernel call of the model: what it moves and how many m8n8k4 it issues."""

    what: str
    bytes_moved: float
    mma: float

    def seconds(self) -> tuple[float, float]:
        return v100.memory_seconds(self.bytes_moved), v100.tensor_seconds(self.mma)


def natural_key(text: str) -> list:
    """Sorts numbers inside names by value (M=2 before M=10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def readable(name: str) -> str:
    if "9attention" in name:
        return sm70_check.attention_readable(name)
    if "3gdn" in name:
        return sm70_check.gdn_readable(name)
    return sm70_check.readable(name)


def unit_of_work(name: str) -> str:
    """m8n8k4 per unit of work, from the kernels' loops (see the atoms in csrc/common/mma_atoms.cuh)."""
    import re

    numbers = [int(n) for n in re.findall(r"Li(\d+)E", name)]
    if "weight_gemv_kernel" in name or "weight_gemm_kernel" in name:
        x_blocks = (numbers[-1] + 7) // 8  # one m8n8k4 per 8 x rows (the fused kernel: BM rows of x per block)
        return f"{64 * x_blocks} per 64×128 weight tile (one m8n8k4 = 8 weight rows × 16 k × 8 x rows)"
    if "paged_attention_kernel" in name:
        d, rows = numbers[-2:]
        if rows == 16:  # decode blocks: warp w takes 16 keys of S and a quarter of the head dims of O
            return f"{2 * d} per 64-key tile, {d // 2} per warp (S: 16 keys × {d}, O += PV: {d // 4} dims × 64 keys)"
        return f"{2 * d} per warp with rows per 64-key tile (S = QKᵀ: {d}, O += PV: {d})"
    if "chunk_prepare_kernel" in name:
        d = numbers[-1]
        return f"{16 * d} per 64-token chunk and value head (KKᵀ, QKᵀ, W, U: 4 × 64·64·{d} MACs / 1024)"
    if "chunk_state_kernel" in name:
        d = numbers[-1]
        return f"{32 * (192 * d + 4096) // 1024} per chunk, head and 32-row state slice ([W;Q]S₀ᵀ, PUᵀ, KᵀU)"
    return "none (no tensor-core work)"


def resource_rows(reports: list[sm70_check.KernelReport]) -> list[str]:
    rows = []
    for r in reports:
        smem = r.static_smem + r.dynamic_smem
        blocks, limiter = v100.occupancy(r.registers, r.threads, smem)
        warps = blocks * -(-r.threads // v100.WARP)
        rows.append(f"| `{readable(r.name)}` | {r.registers} | {r.spill_bytes} | {r.static_smem} | {r.dynamic_smem} | "
                    f"{r.threads} | {blocks} ({warps} warps, {100 * warps // 64} %) | {limiter} | {r.ptx_mma} | "
                    f"{unit_of_work(r.name)} |")
    return rows


def linear_calls(shape) -> list[Call]:
    """GEMV (M = 1, 8, 16: one m8n8k4 per 8 x rows and 128 weights) and fused GEMM (M = 64, 2048) on the decoder's
    fused NVFP4 layers; the GEMM reads the weights once per BM-row strip of M (an L2-miss bound: V100 has 6 MB of
    L2)."""
    served = v100.served_linears(shape)
    layers = {**{f"attention {k}": v for k, v in served["full"].items() if k in ("qkv_proj", "o_proj")},
              **{f"GDN {k}": v for k, v in served["linear"].items() if k in ("in_proj_qkvz", "out_proj")},
              "MLP gate_up_proj": served["full"]["gate_up_proj"], "MLP down_proj": served["full"]["down_proj"]}
    calls = []
    for label, (n, k) in layers.items():
        weights = n * k * NVFP4_BYTES_PER_WEIGHT
        for m in (1, 8, 16):
            calls.append(Call(f"weight_gemv M={m}, {label} {n}×{k}", weights + FP16 * m * (n + k),
                              math.ceil(m / 8) * n * k / 128))
        for m in (64, 2048):
            bm = GEMM_BLOCK_ROWS
            strips = math.ceil(m / bm)
            mma = strips * bm * math.ceil(n / GEMM_TILE_N) * GEMM_TILE_N * k / v100.MMA_M8N8K4_MACS
            calls.append(Call(f"weight_gemm BM={bm} M={m}, {label} {n}×{k}", strips * weights + FP16 * m * (n + k),
                              mma))
    return calls


def attention_calls(shape) -> list[Call]:
    """paged_attention_kernel at the real head_dim, GQA group = heads / kv_heads: decode (batch 1, 8; 16-row decode
    blocks, 2·D m8n8k4 per KV tile and head) and one 2048-token causal prefill; bytes: the fp16 K and V read, q and
    out."""
    d, kv, group = shape.head_dim, shape.kv_heads, shape.heads // shape.kv_heads
    calls = []
    for batch in (1, 8):
        for context in (512, 4096, 8192):
            tiles = math.ceil(context / ATTENTION_TILE_KEYS)
            kv_bytes = batch * context * kv * d * 2 * FP16
            calls.append(Call(f"paged_attention decode D={d}, batch {batch}, context {context}",
                              kv_bytes + batch * shape.heads * d * 2 * FP16, batch * kv * tiles * 2 * d))
    # prefill: a block's 64 rows are 64 / group tokens; it reads every 64-key tile its last token can see. One KV
    # head's K and V at 2048 tokens are 2 MB, inside the 6 MB L2: counted once from DRAM.
    tokens = 2048
    row_tiles = math.ceil(tokens * group / 64)
    key_tiles = sum(math.ceil(min(tokens, (r + 1) * 64 // group) / ATTENTION_TILE_KEYS) for r in range(row_tiles))
    calls.append(Call(f"paged_attention prefill D={d}, 2048 tokens (causal)",
                      tokens * kv * d * 2 * FP16 + tokens * shape.heads * d * 2 * FP16,
                      kv * key_tiles * 8 * d))
    return calls


def gdn_calls(shape) -> list[Call]:
    """recurrent_decode (state read + written, q/k/v/gates) and the chunked prefill kernels at 2048 tokens."""
    gdn = shape.gdn
    d, heads = gdn.key_head_dim, gdn.num_value_heads
    calls = []
    for state_bytes, label in ((4, "fp32"), (2, "fp16")):
        state = heads * d * gdn.value_head_dim * state_bytes
        for batch in (1, 8):
            calls.append(Call(f"recurrent_decode D={d}, {label} state, batch {batch}",
                              batch * (2 * state + FP16 * (2 * gdn.conv_dim + gdn.value_dim)), 0))
    tokens = 2048
    chunks = tokens // GDN_CHUNK
    qkvwu = tokens * FP16 * (2 * gdn.key_dim + 3 * gdn.value_dim)
    calls.append(Call(f"chunk_prepare D={d}, 2048 tokens", qkvwu + chunks * heads * GDN_CHUNK**2 * 2 * FP16,
                      chunks * heads * 16 * d))
    slices = gdn.value_head_dim // GDN_V_SLICE
    calls.append(Call(f"chunk_state D={d}, 2048 tokens, fp32 state", qkvwu + heads * d * gdn.value_head_dim * 4 * 2,
                      chunks * heads * slices * 32 * (192 * d + 4096) / 1024))
    calls.append(Call("causal_conv1d, 2048 tokens", tokens * gdn.conv_dim * FP16 * 2, 0))
    return calls


def time_rows(calls: list[Call]) -> list[str]:
    rows = []
    for call in calls:
        memory, tensor = call.seconds()
        bound = "memory" if memory >= tensor else "tensor"
        rows.append(f"| {call.what} | {call.bytes_moved / 1e6:.2f} | {call.mma / 1e6:.3f} | {memory * 1e6:.1f} | "
                    f"{tensor * 1e6:.1f} | **{max(memory, tensor) * 1e6:.1f}** ({bound}) |")
    return rows


def report(commit: str) -> str:
    families = [("GEMM (csrc/gemm/weight_gemm.cuh)", sm70_check.kernel_source(), None),
                ("attention (csrc/attention/attention.cuh)", sm70_check.attention_kernel_source(),
                 sm70_check.attention_dynamic_smem),
                ("Gated DeltaNet (csrc/gdn/gdn.cuh)", sm70_check.gdn_kernel_source(), sm70_check.gdn_dynamic_smem)]
    config, where = read_config(CONFIG)
    shape = model_shape(config, where)
    lines = [
        "# sm_70 resources of every Volta kernel variant, and a V100 time model at Qwen3.8-27B shapes",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d} UTC, commit {commit}; written by "
        "`tools/sm70_resources.py` (CUDA 12.9 NVRTC → PTX for compute_70 → ptxas 12.9 -v for sm_70; no GPU).",
        "- SASS: not obtained. pip's cuobjdump (13.x; no 12.x wheel exists) needs nvdisasm, and nvdisasm 13.2+ "
        "refuses SM70, so HMMA is counted as PTX `mma.sync.aligned.m8n8k4` (each becomes the 4 HMMA.884 steps of a "
        "16×16×4 warp product on Volta).",
        "- Occupancy on a V100 (80 SMs; per SM 64 K registers in 256-register warp units, 96 KB shared memory, "
        "2048 threads, 32 blocks): resident blocks per SM and the resource that limits them. Dynamic shared memory "
        "is what the launch requests on a V100: decode attention blocks ask for more than their plan to hold their "
        "residency (attention_launch_smem_bytes).",
        "- `PTX mma` is the static count in the kernel's PTX (loop bodies as unrolled); `per unit of work` is the "
        "dynamic count per unit, derived from the tile loops in the source.",
        "- SM80-atom instantiations are not listed: the host never selects them below compute capability 8.0.",
        "",
    ]
    for title, source, dynamic in families:
        _, reports = sm70_check.compile_family(source, dynamic)
        volta = sorted((r for r in reports if "Sm80Mma" not in r.name), key=lambda r: natural_key(readable(r.name)))
        lines += [f"## {title}", "", "| kernel (sm_70) | registers | spill B | static smem B | dynamic smem B | "
                  "threads/block | blocks/SM (warps, occupancy) | limited by | PTX mma | m8n8k4 per unit of work |",
                  "|---|---:|---:|---:|---:|---:|---|---|---:|---|", *resource_rows(volta), ""]
    lines += [
        "## V100 time per kernel call at Qwen3.8-27B shapes — a MODEL, not a measurement",
        "",
        f"Shapes from `{CONFIG.relative_to(REPO)}` (hidden {shape.hidden}, intermediate {shape.intermediate}, "
        f"{shape.heads} Q / {shape.kv_heads} KV heads × {shape.head_dim}, GDN {shape.gdn.num_key_heads} key / "
        f"{shape.gdn.num_value_heads} value heads × {shape.gdn.key_head_dim}). Estimate = max(memory time, tensor "
        f"time): memory = bytes / {v100.HBM_READ_BYTES_PER_S / 1e9:.0f} GB/s (V100 read practice); tensor = "
        f"m8n8k4 count / {v100.MMA_PER_SECOND / 1e9:.1f} G per s. That rate: 125 TFLOP/s / (80 SMs × 1.53 GHz) = "
        f"{v100.TENSOR_PEAK_FLOPS / (v100.SMS * v100.BOOST_CLOCK_HZ):.0f} FLOP per SM per clock = 8 tensor cores × "
        "64 multiply-adds; one warp m8n8k4 is 4 quad-pair 8×8×4 products = 1024 multiply-adds, so "
        f"{v100.MMA_PER_SM_PER_CLOCK:.3f} m8n8k4 per SM per clock. Both are ceilings (full occupancy, perfect "
        "overlap, no launch or tail cost): real kernels are slower. NVFP4 weights at 4.5 bits; the fused GEMM reads "
        "its weight strip once per BM rows of M (L2-miss bound); M = 2048 runs as dequantize + cuBLAS in the "
        "extension, so its row is the fused kernel's hypothetical cost.",
        "",
        "| kernel call | MB moved | m8n8k4 (M) | memory µs | tensor µs | estimate µs |",
        "|---|---:|---:|---:|---:|---:|",
        *time_rows(linear_calls(shape) + attention_calls(shape) + gdn_calls(shape)),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sm70-resources.md")
    parser.add_argument("--commit", default="uncommitted")
    args = parser.parse_args()
    try:
        text = report(args.commit)
    except sm70_check.ToolchainMissing as error:
        print(error, file=sys.stderr)
        return 2
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
