"""A V100-SXM2-32GB as the performance models see it (tools/sm70_resources.py, benchmarks/v100_budget.py).

Every figure a model derives from these is a MODEL, not a measurement: peak or published practice numbers.
"""

from __future__ import annotations

SMS = 80
REGISTERS_PER_SM = 64 * 1024
REGISTER_ALLOCATION_UNIT = 256  # registers per warp are allocated in units of 256 (8 per thread)
MAX_REGISTERS_PER_THREAD = 255
SMEM_PER_SM = 96 * 1024
SMEM_ALLOCATION_UNIT = 256
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
WARP = 32

BOOST_CLOCK_HZ = 1530e6
TENSOR_PEAK_FLOPS = 125e12  # fp16 tensor-core peak at the boost clock
CUBLAS_FP16_FLOPS = 99e12  # cuBLAS fp16 GEMM in practice at large sizes (97-101 TFLOP/s)
HBM_PEAK_BYTES_PER_S = 900e9
HBM_READ_BYTES_PER_S = 870e9  # read bandwidth in practice
PCIE_BYTES_PER_S = (10e9, 12e9)  # host → device in practice (PCIe 3.0 x16)
MEMORY_BYTES = 32510 * 1024 * 1024  # what nvidia-smi / torch report for a V100-32GB (planner.GPU_PRESETS)

# One warp-wide mma.sync.aligned.m8n8k4 (PTX) on Volta runs four 8×8×4 products, one per quad-pair: 1024
# multiply-adds, 2048 FLOP. 125 TFLOP/s / (80 SMs × 1.53 GHz) = 1021 FLOP per SM per clock ≈ 512 multiply-adds
# (8 tensor cores × 4×4×4), so an SM retires one m8n8k4 every 2 clocks: 0.5 per SM per clock.
MMA_M8N8K4_MACS = 8 * 8 * 4 * 4
MMA_PER_SM_PER_CLOCK = TENSOR_PEAK_FLOPS / (SMS * BOOST_CLOCK_HZ) / (2 * MMA_M8N8K4_MACS)
MMA_PER_SECOND = MMA_PER_SM_PER_CLOCK * SMS * BOOST_CLOCK_HZ


def occupancy(registers: int, threads: int, smem_bytes: int) -> tuple[int, str]:
    """(resident blocks per SM, what limits them) for a kernel of ``threads`` per block (CUDA occupancy rules:
    registers per warp in 256-register units, shared memory in 256-byte units, 2048 threads, 32 blocks)."""
    if threads <= 0:
        raise ValueError("threads per block must be positive")
    warps = -(-threads // WARP)
    per_warp = -(-max(registers, 1) * WARP // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    limits = {"threads": MAX_THREADS_PER_SM // (warps * WARP), "blocks": MAX_BLOCKS_PER_SM,
              "registers": (REGISTERS_PER_SM // per_warp) // warps}
    if smem_bytes:
        limits["shared memory"] = SMEM_PER_SM // (-(-smem_bytes // SMEM_ALLOCATION_UNIT) * SMEM_ALLOCATION_UNIT)
    limiter = min(limits, key=limits.get)
    return limits[limiter], limiter


def memory_seconds(bytes_moved: float, bandwidth: float = HBM_READ_BYTES_PER_S) -> float:
    return bytes_moved / bandwidth


def tensor_seconds(mma_count: float) -> float:
    """Time of ``mma_count`` m8n8k4 instructions with every SM's tensor cores busy."""
    return mma_count / MMA_PER_SECOND


def served_linears(shape) -> dict[str, dict[str, tuple[int, int]]]:
    """{layer kind ("full" / "linear"): {fused layer vLLM serves: (rows, cols)}} of one decoder layer of each kind,
    from toolkit.planner.linear_shapes (q/k/v → qkv_proj, gate/up → gate_up_proj, in_proj_qkv/z → in_proj_qkvz,
    in_proj_b/a → in_proj_ba), plus {"head": {"lm_head": …}}."""
    from vllm_volta_fp4.toolkit.planner import _FUSED_INTO, linear_shapes

    first = {kind: shape.layer_kinds.index(kind) for kind in ("full", "linear") if kind in shape.layer_kinds}
    layers: dict[str, dict[str, tuple[int, int]]] = {kind: {} for kind in first}
    for module, rows, cols in linear_shapes(shape):
        if module == "lm_head" or "embed" in module:
            layers.setdefault("head", {})[module.rpartition(".")[2] or module] = (rows, cols)
            continue
        index = int(module.split(".layers.")[1].split(".")[0])
        kind = next((k for k, i in first.items() if i == index), None)
        if kind is None:
            continue
        leaf = module.rpartition(".")[2]
        fused = _FUSED_INTO.get(leaf, leaf)
        old_rows, _ = layers[kind].get(fused, (0, cols))
        layers[kind][fused] = (old_rows + rows, cols)
    return layers
