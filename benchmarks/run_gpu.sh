#!/usr/bin/env bash
# One device call: build the extension for the GPU at hand, run the GPU tests, run the benchmark.
# Logs and the table go to $OUT (the device tool brings them back). Usage: benchmarks/run_gpu.sh [quick] [notests]
set -uo pipefail
OUT=${OUT:-/tmp/vvf4-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ARCH=$(python3 -c "import torch; c=torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
TORCH_CUDA_ARCH_LIST=$ARCH VLLM_VOLTA_FP4_BUILD_EXT=1 MAX_JOBS=16 python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 \
  || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
if [[ " $* " != *" notests "* ]]; then
  python3 -c "import torch, vllm_volta_fp4._C" || exit 1
  python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
fi
BENCH_ARGS=(--out "$OUT/gemm-h200.md" --commit "${COMMIT:-uncommitted}")
[[ " $* " == *" quick "* ]] && BENCH_ARGS+=(--quick)
python3 benchmarks/bench_gemm.py "${BENCH_ARGS[@]}" > "$OUT/bench.log" 2>&1; rc=$?
tail -5 "$OUT/bench.log"
[[ -f "$OUT/gemm-h200.md" ]] && cat "$OUT/gemm-h200.md"
exit $rc
