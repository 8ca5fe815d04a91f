#!/usr/bin/env bash
# One device call (nvidia-h200) for issue #16, MTP speculative decoding, both vLLM versions:
#   here:   bash tools/build_wheel.sh && bash scripts/gpu/make_gpu_kit.sh 0.20.2 && bash scripts/gpu/make_gpu_kit.sh 0.19.1
#           python -m devkit.mtp_training --out .mtp-trained   (the trained tiny checkpoint, CPU, ~2 min)
#   device: carry ["dist", ".gpu-kit-0.20.2", ".gpu-kit-0.19.1", ".gpu-kit-wheels", ".mtp-trained"],
#           COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu/run_mtp_gpu.sh
# 1. tests/gpu/test_mtp_lossless.py (every format, K 1/3, batch 1/4, eager and default mode) under each version,
#    and beside them benchmarks/mtp_acceptance_vllm.py on .mtp-trained (vLLM's acceptance length, default mode);
# 2. benchmarks/mtp_round_cost.py (27B widths, default mode) under vLLM 0.20.2: K in $KS (default 1,2,3; an engine
#    start is 1-2 min, so K = 4..7 need a call of their own: KS=4,5,6,7 SKIP="lossless acceptance").
# Logs and tables land in $OUT. SKIP="lossless acceptance round-cost" leaves parts out; MODES (pytest -k) selects tests,
# MTP_WORKERS runs them on pytest-xdist workers, DEADLINE bounds the call (run_steps.sh); ACCEPTANCE_VERSIONS (default:
# VERSIONS) and ACCEPTANCE_ARGS (e.g. "--ks 3 --draft-formats fp8,nvfp4,fp16") shape the acceptance runs.
set -uo pipefail
VERSIONS=${VERSIONS:-"0.20.2 0.19.1"}
source scripts/gpu/run_steps.sh
status=0
pids=()

step build
source scripts/gpu/gpu_build.sh
source scripts/gpu/gpu_kits.sh
if ! skip lossless; then  # the versions side by side, MTP_WORKERS pytest-xdist workers each
  selection=()
  [[ -n "${MODES:-}" ]] && selection=(-k "$MODES")
  step "lossless MTP tests, vLLM $VERSIONS"
  for version in $VERSIONS; do
    PYTHONPATH=${SITES[$version]}:$PYTHONPATH timeout "$(seconds_left)" python3 -m pytest -v -p no:cacheprovider \
      ${MTP_WORKERS:+-n $MTP_WORKERS --dist loadgroup} tests/gpu/test_mtp_lossless.py "${selection[@]}" > "$OUT/mtp-lossless-$version.log" 2>&1 &
    pids+=($!)
  done
fi
if ! skip acceptance; then  # beside the lossless tests: a few small engines
  step "vLLM's acceptance on the trained checkpoint, vLLM ${ACCEPTANCE_VERSIONS:-$VERSIONS}"
  for version in ${ACCEPTANCE_VERSIONS:-$VERSIONS}; do  # one version after the other: its decode speed is measured
    PYTHONPATH=${SITES[$version]}:$PYTHONPATH timeout "$(seconds_left)" python3 benchmarks/mtp_acceptance_vllm.py \
      --model .mtp-trained --out "$OUT/mtp-acceptance-$version.md" --commit "${COMMIT:-unknown}" ${ACCEPTANCE_ARGS:-} \
      > "$OUT/mtp-acceptance-$version.log" 2>&1 || exit 1
  done &
  pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
skip lossless || for version in $VERSIONS; do echo "vLLM $version: $(summary "$OUT/mtp-lossless-$version.log")"; done
skip acceptance || cat "$OUT"/mtp-acceptance-*.md 2>/dev/null
if ! skip round-cost; then
  step "MTP round cost at 27B widths, vLLM 0.20.2"
  PYTHONPATH=${SITES[0.20.2]}:$PYTHONPATH GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    timeout "$(seconds_left)" python3 benchmarks/mtp_round_cost.py --out "$OUT/mtp-round-cost.md" --commit "${COMMIT:-unknown}" --ks "${KS:-1,2,3}" \
    > "$OUT/mtp-round-cost.log" 2>&1 || status=1
  tail -15 "$OUT/mtp-round-cost.log"
fi
# At most 8 files come back from $OUT: the tables, and the logs in one archive.
rm -f "$OUT"/kit-install-*.log "$OUT/gpu.txt"
tar czf "$OUT/mtp-logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
exit $status
