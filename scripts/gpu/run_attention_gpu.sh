#!/usr/bin/env bash
# One device call for the attention kernels: the carried wheel's extension (carry ["dist"]), the attention GPU
# tests, the attention benchmark. Logs and the table go to $OUT.
# Usage: scripts/gpu/run_attention_gpu.sh [quick] [e2e | e2e-only]
#   e2e: also run vLLM end to end with our backend (benchmarks/attention_e2e.py); needs the shared gpu-vllm-kit
#   made here into .gpu-kit (bash scripts/gpu/make_gpu_kit.sh) and carried: carry [".gpu-kit"].
set -uo pipefail
source scripts/gpu/gpu_build.sh
tests_rc=0 bench_rc=0
if [[ " $* " != *" e2e-only "* ]]; then
  python3 -m pytest -q tests/gpu/test_attention_gpu.py -p no:cacheprovider -rs -s 2>&1 > "$OUT/attention-tests.log"
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
  BENCH_ARGS=(--out "$OUT/attention-h200.md" --commit "${COMMIT:-uncommitted}")
  [[ " $* " == *" quick "* ]] && BENCH_ARGS+=(--quick)
  python3 benchmarks/bench_attention.py "${BENCH_ARGS[@]}" > "$OUT/attention-bench.log" 2>&1; bench_rc=$?
  tail -5 "$OUT/attention-bench.log"
  [[ -f "$OUT/attention-h200.md" ]] && cat "$OUT/attention-h200.md"
fi
e2e_rc=0
if [[ " $* " == *" e2e "* || " $* " == *" e2e-only "* ]]; then
  source scripts/gpu/gpu_kit_install.sh
  PYTHONPATH=$SITE:$PYTHONPATH python3 benchmarks/attention_e2e.py --kit .gpu-kit > "$OUT/attention-e2e.log" 2>&1
  e2e_rc=$?
  grep -E "head_dim|E2E-" "$OUT/attention-e2e.log"
fi
exit $(( tests_rc || bench_rc || e2e_rc ))
