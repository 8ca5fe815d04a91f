#!/usr/bin/env bash
# One device call on the two-GPU kind (nvidia-h200-x2) for the whole vLLM end-to-end story, both vLLM versions:
#   here:   bash tools/build_wheel.sh && bash scripts/gpu/make_gpu_kit.sh 0.20.2 && bash scripts/gpu/make_gpu_kit.sh 0.19.1
#   device: kind nvidia-h200-x2, carry ["dist", ".gpu-kit-0.20.2", ".gpu-kit-0.19.1", ".gpu-kit-wheels"],
#           COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu/run_e2e_gpu.sh
# Phase 1, side by side: GPU 0 and a quarter of the CPU cores measure engine throughput alone
# (benchmarks/throughput_e2e.py, vLLM 0.20.2; the engine is CPU-bound in eager mode, so it gets cores of its own);
# GPU 1 and the other cores run the kernel tests, and tests/gpu/test_vllm_end_to_end.py and test_gdn_plugin_gpu.py
# (our GDN kernels inside vLLM's GDN layer) under each vLLM version.
# Phase 2: the tensor-parallel-2 tests over both GPUs, each vLLM version. Logs and tables land in $OUT.
# On a one-GPU machine phase 1 runs one after the other on GPU 0 and phase 2 is skipped.
# Before them, README's serve line in default mode under each version (README_VERSIONS) alone on the GPU.
# SKIP="readme throughput kernel-tests tp2" leaves those parts out. E2E_SELECT (pytest -k, default: eager engines only) picks
# the end-to-end tests, E2E_WORKERS their pytest-xdist workers per version, E2E_TIMEOUT their time per vLLM version
# (default: what is left of the call); the default-mode engines (torch.compile + CUDA
# graphs, ~1 min each) go in calls of their own, e.g. SKIP="throughput kernel-tests tp2" E2E_SELECT="default-mode and
# llama" (then "... and qwen3 and not qwen3_5", "... and qwen3_5"); the CUDA graph modes vLLM chose land in
# $OUT/graph-modes-VERSION.jsonl.
set -uo pipefail
VERSIONS=${VERSIONS:-"0.20.2 0.19.1"}
source scripts/gpu/run_steps.sh
status=0

step build
source scripts/gpu/gpu_build.sh
step "install the vLLM kits: $VERSIONS"
source scripts/gpu/gpu_kits.sh
if ! skip readme; then  # alone on the GPU: vLLM serve claims 90 % of its memory
  source scripts/gpu/readme_serve.sh
  for version in ${README_VERSIONS:-$VERSIONS}; do
    step "README's serve line, default mode, vLLM $version"
    readme_serve "${SITES[$version]}" "$OUT/readme-serve-$version.log" || status=1
  done
fi
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
second=$(( gpus > 1 ? 1 : 0 ))
cores=$(nproc); quarter=$(( cores / 4 ))
pin_bench=(); pin_tests=()
if command -v taskset > /dev/null && (( gpus > 1 )); then
  pin_bench=(taskset -c 0-$(( quarter - 1 ))); pin_tests=(taskset -c $quarter-$(( cores - 1 )))
  export OMP_NUM_THREADS=4  # the tests' CPU references: many processes share the cores
fi
e2e() {  # e2e VERSION GPUS PYTEST_ARGS... → $OUT/e2e-VERSION[-tp].log
  local version=$1 devices=$2 log=$3; shift 3
  CUDA_VISIBLE_DEVICES=$devices PYTHONPATH=${SITES[$version]}:$PYTHONPATH \
    VOLTA_FP4_GRAPH_MODES_FILE=$OUT/graph-modes-$version.jsonl timeout "${E2E_TIMEOUT:-$(seconds_left)}" "${pin_tests[@]}" \
    python3 -m pytest -v -p no:cacheprovider ${E2E_WORKERS:+-n $E2E_WORKERS} tests/gpu/test_vllm_end_to_end.py \
    tests/gpu/test_gdn_plugin_gpu.py "$@" > "$log" 2>&1
}

step "phase 1: throughput on GPU 0 | kernel tests and end-to-end tests on GPU $second"
skip throughput || ( CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${SITES[0.20.2]}:$PYTHONPATH \
    OMP_NUM_THREADS=$(( quarter > 0 ? quarter : 1 )) timeout 400 "${pin_bench[@]}" python3 benchmarks/throughput_e2e.py \
    --out "$OUT/throughput-h200.md" --commit "${COMMIT:-uncommitted}" > "$OUT/throughput.log" 2>&1 ) & throughput=$!
(( gpus > 1 )) || wait $throughput
pids=()
skip kernel-tests ||
CUDA_VISIBLE_DEVICES=$second timeout $(( $(seconds_left) < 360 ? $(seconds_left) : 360 )) "${pin_tests[@]}" python3 -m pytest -q -n 4 -p no:cacheprovider tests/gpu \
  --ignore tests/gpu/test_vllm_end_to_end.py --ignore tests/gpu/test_gdn_plugin_gpu.py > "$OUT/gpu-tests.log" 2>&1 & pids+=($!)
for version in $VERSIONS; do e2e "$version" "$second" "$OUT/e2e-$version.log" \
  -k "not tensor_parallel and (${E2E_SELECT:-not default-mode})" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
wait $throughput || status=1
skip kernel-tests || echo "kernel tests: $(summary "$OUT/gpu-tests.log")"
for version in $VERSIONS; do echo "vLLM $version end to end: $(summary "$OUT/e2e-$version.log")"; done
if ! skip throughput; then
  if [[ -f "$OUT/throughput-h200.md" ]]; then cat "$OUT/throughput-h200.md"; else tail -20 "$OUT/throughput.log"; status=1; fi
fi

if (( gpus > 1 )) && ! skip tp2; then
  step "phase 2: tensor parallel 2"
  pids=()
  for version in $VERSIONS; do e2e "$version" 0,1 "$OUT/e2e-$version-tp2.log" -k "tensor_parallel and not default-mode" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for version in $VERSIONS; do echo "vLLM $version tensor parallel 2: $(summary "$OUT/e2e-$version-tp2.log")"; done
fi
step "done"
# At most 8 files come back from $OUT: keep the results and the logs of what failed.
rm -f "$OUT"/kit-install-*.log "$OUT/gpu.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
exit $status
