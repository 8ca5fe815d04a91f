#!/usr/bin/env bash
# The seeds' benchmark at full depth (Qwen3.8-27B shape, 64 layers, vocabulary 248,320) on one H200, in stages that
# each fit one device call (10 min), 64 GB of disk and the session's 30 device-minutes:
#   here:   bash tools/build_wheel.sh && bash scripts/gpu/make_gpu_kit.sh 0.20.2
#   device: kind nvidia-h200, carry ["dist", ".gpu-kit-0.20.2", ".gpu-kit-wheels"], one call per stage, back
#           to back (the machine keeps /tmp only while warm: 30 s idle; a cold machine redoes build + kit +
#           checkpoint, ~3-4 min of the call):
#     STAGE=1 COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu/run_full_depth_gpu.sh
# Stages, in the order of the issue's goals (each pair ENGINE:MODE:MAX_MODEL_LENS is one engine per length):
#   1  build, kit, the W4A16 checkpoint (~19 GB, streamed layer by layer on the GPU), w4a16:default:4096
#   2  fp16:default:4096 (whole GPU, load_format=dummy; ~5 min of the call)
#   3  w4a16 and fp16 at max-model-len 8192, default mode
#   4  eager mode: w4a16 and fp16 at 4096 and 8192
#   5  the ModelOpt mixed checkpoint (a second ~19 GB) and mixed:default:4096,8192
#   6  issue #16's MTP round cost at full depth on the W4A16 checkpoint (it carries the MTP module): a plain engine
#      and K in ${KS:-3}, the FP8 drafter (layer + lm_head copy) and the 16-bit one (${DRAFT_FORMATS:-fp8,fp16};
#      benchmarks/mtp_round_cost.py --model), default mode
#   7  fp16-offload:default:4096, alone: cpu_offload_gb to fit 32 GB through the kit's stand-in for vLLM's UVA op
#      (if it fails, PCIe H2D is measured and the row is a MODEL). Its start (27 GB offloaded, load + compile) took
#      2.5 min and every step reads the offloaded weights over PCIe, so it gets the whole call (measured
#      2026-12-02: sharing stage 2's call with the fp16 engine, it ran out of time before its first row).
# Device time: the engine starts dominate (27B weights from page cache, torch.compile, CUDA graphs). Measured
# 2026-12-02: stage 1 took 6 min of its call on a cold machine (build, kit, checkpoint 40 s, the engine), stage 2
# 5 min; so one session's 30 minutes hold about stages 1, 2 and 7. PAIRS="w4a16:eager:4096 …" overrides a stage's list.
# A pair's ENGINE may list several engines ("mixed,w4a16:default:8192"): one process, each later engine starts in
# ~70 s instead of ~180 s. Not the fp16 whole-GPU engine after others: they leave ~55 GB allocated and its 0.9 of
# the GPU does not fit (measured 2026-12-03); give it a pair of its own.
# Eager pairs, one length and one pair per call, PAIR_TIMEOUT=420 (stage 4's list is the whole set, for PAIRS to
# pick from). Measured 2026-12-03 (7ad1c2e): PAIRS="w4a16:eager:4096" took 300 s (engine start 130 s, of it 87 s
# in the first profile run on a cold machine; the three batches and their profiled steps 165 s: ~77 ms per eager
# step at batch 1), then PAIRS="fp16:eager:4096" on the same warm machine 160 s.
# Every stage appends its rows to /tmp/full-depth/results.json (replacing rows of the same engine, mode and
# length) and re-renders $OUT/$STEM.md and .png from all rows so far, STEM = full-depth-27b-h100 or -h200 by the
# GPU's model (one table per GPU: rows of different GPUs are not compared). A machine without that file starts from
# the committed rows (benchmarks/results/$STEM.json), so copy the three files that come back to benchmarks/results/
# after every stage (full-depth-results.json → $STEM.json).
set -uo pipefail
STAGE=${STAGE:-1}
WORK=${WORK:-/tmp/full-depth}
KIT=${KIT:-.gpu-kit-0.20.2}
source scripts/gpu/run_steps.sh
case $STAGE in
  1) stage_pairs="w4a16:default:4096" ;;
  2) stage_pairs="fp16:default:4096" ;;
  3) stage_pairs="w4a16:default:8192 fp16:default:8192" ;;
  4) stage_pairs="w4a16:eager:4096,8192 fp16:eager:4096,8192" ;;
  5) stage_pairs="mixed:default:4096,8192"; formats=ct-w4a16,modelopt-mixed ;;
  6) stage_pairs="" ;;
  7) stage_pairs="fp16-offload:default:4096"; PAIR_TIMEOUT=${PAIR_TIMEOUT:-480} ;;
  *) echo "STAGE must be 1-7"; exit 2 ;;
esac
PAIRS=${PAIRS:-$stage_pairs}
formats=${formats:-ct-w4a16}

step build
if python3 -c "import torch, vllm_volta_fp4._C" 2>/dev/null && [[ -d /tmp/site-${KIT#.gpu-kit-} ]]; then
  OUT=${OUT:-/tmp/vvf4-out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  echo "warm machine: extension and kit already in place"
else
  source scripts/gpu/gpu_build.sh
  step "install the vLLM kit $KIT"
  KIT=$KIT source scripts/gpu/gpu_kit_install.sh
fi
export PYTHONPATH=/tmp/site-${KIT#.gpu-kit-}:$PYTHONPATH VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 \
  TVM_FFI_DISABLE_TORCH_C_DLPACK=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
df -h /tmp | tail -1

mkdir -p "$WORK"
gpu_model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr A-Z a-z)
STEM=${STEM:-full-depth-27b-${gpu_model:-gpu}}
[[ -f "$WORK/results.json" || ! -f benchmarks/results/$STEM.json ]] ||
  cp "benchmarks/results/$STEM.json" "$WORK/results.json"
step "checkpoints: $formats"
timeout 300 python3 benchmarks/full_depth_e2e.py checkpoint --workdir "$WORK" --formats "$formats" \
  > "$OUT/checkpoint.log" 2>&1 || { tail -20 "$OUT/checkpoint.log"; exit 1; }
tail -3 "$OUT/checkpoint.log"

status=0
for pair in $PAIRS; do
  IFS=: read -r engine mode lengths <<< "$pair"
  step "bench: $engine, $mode, max-model-len $lengths"
  timeout "${PAIR_TIMEOUT:-360}" python3 benchmarks/full_depth_e2e.py bench --workdir "$WORK" --out-dir "$OUT" \
    --engines "$engine" --modes "$mode" --max-model-lens "$lengths" --commit "${COMMIT:-uncommitted}" \
    --stem "$STEM" --preload scripts/gpu/uva_view_standin.py \
    > "$OUT/bench-$engine-$mode-${lengths//,/-}.log" 2>&1 || status=1
  grep -E "^wrote|Error|error:|tok/s" "$OUT/bench-$engine-$mode-${lengths//,/-}.log" | tail -6
  cp "$WORK/results.json" "$OUT/full-depth-results.json" 2>/dev/null  # after every pair: a call cut short keeps them
done
if (( STAGE == 6 )); then
  step "MTP round cost at full depth, K = ${KS:-3}"
  GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" timeout "$(seconds_left)" \
    python3 benchmarks/mtp_round_cost.py --model "$WORK/ct-w4a16" --ks "${KS:-3}" --out "$OUT/mtp-round-cost-64.md" \
    --draft-formats "${DRAFT_FORMATS:-fp8,fp16}" ${HOST_PROFILE:+--host-profile "$OUT"} \
    --commit "${COMMIT:-uncommitted}" > "$OUT/mtp-round-cost-64.log" 2>&1 || status=1
  cat "$OUT/mtp-round-cost-64.md" 2> /dev/null || tail -20 "$OUT/mtp-round-cost-64.log"
fi
cp "$WORK/results.json" "$OUT/full-depth-results.json" 2>/dev/null
[[ -f "$OUT/$STEM.md" ]] && cat "$OUT/$STEM.md"
step done
# At most 8 files come back: the table, the plot, the rows, and the logs in one archive.
rm -f "$OUT"/kit-install-*.log "$OUT/gpu.txt"
tar czf "$OUT/full-depth-logs-stage$STAGE.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
exit $status
