#!/usr/bin/env bash
# One device call (sm_80+): the GEMV probe (scripts/gpu/gemv_probe.cu: GEMV vs a pure read of the same bytes, per
# shape and M) and Nsight Compute sections for the qkv GEMV at M = 1 and 8 and the read kernel.
# Writes $OUT/gemv-probe.txt and $OUT/gemv-ncu.txt. Usage: scripts/gpu/run_gemv_probe_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/vvf4-out}
mkdir -p "$OUT"
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -arch=sm_$ARCH -O3 -std=c++17 --use_fast_math -lineinfo -Icsrc scripts/gpu/gemv_probe.cu -o /tmp/gemv_probe || exit 1
/tmp/gemv_probe | tee "$OUT/gemv-probe.txt"
ncu --clock-control none -k 'regex:weight_gemv|read_kernel' --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats \
  /tmp/gemv_probe ncu > "$OUT/gemv-ncu.txt" 2>&1
grep -E "weight_gemv|read_kernel|Duration|DRAM Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per Thread" \
  "$OUT/gemv-ncu.txt"
