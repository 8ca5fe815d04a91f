#!/usr/bin/env bash
# One device call for everything GPU-side, most important first, each step under its own time limit:
# build the extension, GPU tests, vLLM end to end with the plugin (NVFP4 GEMMs + attention backend), the attention
# backend end to end, a quick GEMM benchmark. Needs the shared gpu-vllm-kit made here into .gpu-kit and carried:
#   bash benchmarks/make_gpu_kit.sh ;  device run, carry [".gpu-kit"]:
#   COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_all_gpu.sh [no-attention-e2e] [no-bench]
set -uo pipefail
want() { [[ " $ARGS " != *" no-$1 "* ]]; }
ARGS="$*"
status=0
step() { echo; echo "=== $1 ($(date +%T)) ==="; }

step build
source benchmarks/gpu_build.sh

step "GPU tests"
timeout 150 python3 -m pytest -q -n 4 tests/gpu -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1 || status=1
tail -4 "$OUT/gpu-tests.log"

step "install the vLLM kit"
source benchmarks/gpu_kit_install.sh

step "vLLM end to end: NVFP4 checkpoints through volta_nvfp4"
PYTHONPATH=$SITE:$PYTHONPATH timeout 120 python3 benchmarks/nvfp4_e2e.py --kit .gpu-kit > "$OUT/nvfp4-e2e.log" 2>&1 || status=1
grep -E "extension available|tokens matching|NVFP4-E2E|Error" "$OUT/nvfp4-e2e.log" | head -20

if want attention-e2e; then
  step "vLLM end to end: attention backend vs Hugging Face"
  PYTHONPATH=$SITE:$PYTHONPATH timeout 150 python3 benchmarks/attention_e2e.py --kit .gpu-kit > "$OUT/attention-e2e.log" 2>&1 || status=1
  grep -E "head_dim|E2E-|Error" "$OUT/attention-e2e.log" | head -20
fi

step "doctor on a GPU machine"
timeout 30 python3 -m vllm_volta_fp4.cli doctor > "$OUT/doctor.log" 2>&1; cat "$OUT/doctor.log"

if want bench; then
  step "GEMM benchmark (quick)"
  timeout 110 python3 benchmarks/bench_gemm.py --quick --out "$OUT/gemm-h200-quick.md" --commit "${COMMIT:-uncommitted}" \
    > "$OUT/bench.log" 2>&1 || status=1
  [[ -f "$OUT/gemm-h200-quick.md" ]] && cat "$OUT/gemm-h200-quick.md" || tail -5 "$OUT/bench.log"
fi
exit $status
