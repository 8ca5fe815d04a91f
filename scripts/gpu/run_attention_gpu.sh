#!/usr/bin/env bash
# One device call for the attention kernels: the carried wheel's extension (carry ["dist"]), the attention GPU
# tests, the attention benchmark. Logs and the tables go to $OUT.
# Usage: [BASELINE_WHEEL=.whl/…whl] [SWEEP_SHAPE=…] scripts/gpu/run_attention_gpu.sh [quick] [sweep]
#   sweep: also the decode sweep (issue #17: head_dim 64/128/256, GQA 6:1 and 8:1, batch 1-64, context 128-32768,
#   every split count) into $OUT/attention-decode-h200.md (only the shapes whose name contains SWEEP_SHAPE)
#   BASELINE_WHEEL (carry its folder): after the tests, the sweep (shapes matching BASELINE_SWEEP_SHAPE, default
#   the Qwen3.8-27B one) and the quick comparison with that wheel's kernels, into $OUT/baseline-*.md: a before/after
#   on one GPU in one call. Then the wheel's own tables.
set -uo pipefail
source scripts/gpu/gpu_build.sh
python3 -m pytest -q tests/gpu/test_attention_gpu.py tests/gpu/test_attention_graphs.py -p no:cacheprovider -rs -s 2>&1 > "$OUT/attention-tests.log"
tests_rc=$?
tail -30 "$OUT/attention-tests.log"
python3 - "$OUT/attention-tests.log" <<'PY'
import re, sys
errors = [(float(r), float(a), line.split(":")[0]) for line in open(sys.argv[1])
          for r, a in re.findall(r"rel ([0-9.e+-]+), max abs ([0-9.e+-]+)", line)]
if errors:
    print(f"{len(errors)} checked cases; largest rel {max(errors)[0]:.2e} ({max(errors)[2]}), "
          f"largest max-abs {max(e[1] for e in errors):.2e}")
PY
BENCH_ARGS=(--commit "${COMMIT:-uncommitted}")
[[ " $* " == *" quick "* ]] && BENCH_ARGS+=(--quick)
SWEEP_ARGS=(--decode-sweep --sweep-shape "${SWEEP_SHAPE:-}")
baseline_rc=0
if [[ -n "${BASELINE_WHEEL:-}" ]]; then
  # The baseline's extension and kernel image in the checkout's place, then the wheel's back.
  use_wheel_package "$BASELINE_WHEEL" /tmp/baseline-unpacked || exit 1
  base_commit=${BASELINE_COMMIT:-$(basename "$BASELINE_WHEEL")}
  python3 benchmarks/bench_attention.py --decode-sweep --sweep-shape "${BASELINE_SWEEP_SHAPE:-Qwen3.8}" \
    --out "$OUT/baseline-attention-decode.md" \
    --commit "$base_commit" > "$OUT/baseline-attention-decode.log" 2>&1 || baseline_rc=1
  python3 benchmarks/bench_attention.py --quick --out "$OUT/baseline-attention.md" --commit "$base_commit" \
    > "$OUT/baseline-attention.log" 2>&1 || baseline_rc=1
  tail -n 3 "$OUT"/baseline-attention*.log
  use_wheel_package "$wheel" /tmp/wheel-unpacked || exit 1
fi
python3 benchmarks/bench_attention.py --out "$OUT/attention-h200.md" "${BENCH_ARGS[@]}" > "$OUT/attention-bench.log" 2>&1
bench_rc=$?
tail -5 "$OUT/attention-bench.log"
[[ -f "$OUT/attention-h200.md" ]] && cat "$OUT/attention-h200.md"
sweep_rc=0
if [[ " $* " == *" sweep "* ]]; then
  python3 benchmarks/bench_attention.py "${SWEEP_ARGS[@]}" --out "$OUT/attention-decode-h200.md" "${BENCH_ARGS[@]}" \
    > "$OUT/attention-decode.log" 2>&1
  sweep_rc=$?
  tail -5 "$OUT/attention-decode.log"
  [[ -f "$OUT/attention-decode-h200.md" ]] && cat "$OUT/attention-decode-h200.md"
fi
# At most 8 files come back from a call: the tables, and the logs in one archive.
tar czf "$OUT/attention-logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log gpu.txt 2> /dev/null) && rm -f "$OUT"/*.log "$OUT/gpu.txt"
exit $(( tests_rc || baseline_rc || bench_rc || sweep_rc ))
