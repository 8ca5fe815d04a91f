#!/usr/bin/env bash
# One device call (carry ["dist"]: bash tools/build_wheel.sh here): the wheel's extension, the GPU tests, the benchmark.
# Logs and the table go to $OUT (the device tool brings them back).
# Usage: [TESTS="tests/gpu/test_weight_gemm.py"] scripts/gpu/run_gpu.sh [quick] [notests]
# (TESTS: the pytest paths, default tests/gpu)
set -uo pipefail
source scripts/gpu/gpu_build.sh
if [[ " $* " != *" notests "* ]]; then
  python3 -c "import torch, vllm_volta_fp4._C" || exit 1
  python3 -m pytest -q ${TESTS:-tests/gpu} -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
fi
BENCH_ARGS=(--out "$OUT/gemm-h200.md" --commit "${COMMIT:-uncommitted}")
[[ " $* " == *" quick "* ]] && BENCH_ARGS+=(--quick)
python3 benchmarks/bench_gemm.py "${BENCH_ARGS[@]}" > "$OUT/bench.log" 2>&1; rc=$?
tail -5 "$OUT/bench.log"
[[ -f "$OUT/gemm-h200.md" ]] && cat "$OUT/gemm-h200.md"
exit $rc
