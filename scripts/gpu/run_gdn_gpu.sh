#!/usr/bin/env bash
# One device call for the Gated DeltaNet kernels: the carried wheel's extension (carry ["dist"]), the GDN GPU tests
# (4 workers), summarise their errors against the float64 references, run the GDN benchmark. Logs and the tables go
# to $OUT. Usage: OUT=... COMMIT=<hash> bash scripts/gpu/run_gdn_gpu.sh
# VERSIONS="0.20.2 0.19.1": the benchmark runs once per vLLM kit instead, each table with that vLLM's Triton kernels
# beside ours (make the kits here with scripts/gpu/make_gpu_kit.sh VERSION; carry [".gpu-kit-0.20.2", ...]).
# SKIP=tests leaves the tests out. With vLLM the benchmark may take ~5 min (Triton compiles and autotunes vLLM's
# kernels on first use): give each version its own device call, VERSIONS=0.20.2 SKIP=tests, then 0.19.1.
set -uo pipefail
source scripts/gpu/run_steps.sh
source scripts/gpu/gpu_build.sh
tests_rc=0
if ! skip tests; then
  OMP_NUM_THREADS=4 timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_gdn_gpu.py -p no:cacheprovider -rA > "$OUT/gdn-tests.log" 2>&1
  tests_rc=$?
  grep -E "passed|failed|error" "$OUT/gdn-tests.log" | tail -5
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gdn-tests.log" | head -30
  python3 - "$OUT/gdn-tests.log" <<'PY'
import re, sys
cases = [(float(r), float(a) / max(float(m), 1e-3), line.strip()) for line in open(sys.argv[1])
         for r, a, m in re.findall(r"rel ([0-9.e+-]+), max abs ([0-9.e+-]+) \(max \|ref\| ([0-9.e+-]+)\)", line)]
if cases:
    print(f"{len(cases)} checked results; largest rel {max(cases)[0]:.2e} ({max(cases)[2]}); "
          f"largest max-abs / max|ref| {max(c[1] for c in cases):.2e}")
PY
fi
bench() {  # bench NAME SECONDS [SITE]: the benchmark (with the vLLM kit at SITE) → $OUT/NAME.md, $OUT/NAME.log
  PYTHONPATH=${3:+$3:}$PYTHONPATH timeout "$2" python3 benchmarks/bench_gdn.py --out "$OUT/$1.md" \
    --commit "${COMMIT:-uncommitted}" > "$OUT/$1.log" 2>&1
  local rc=$?
  grep -E "^vLLM" "$OUT/$1.log"  # what it could not compare
  tail -3 "$OUT/$1.log"
  [[ -f "$OUT/$1.md" ]] && cat "$OUT/$1.md"
  return $rc
}
bench_rc=0
if [[ -z "${VERSIONS:-}" ]]; then
  bench gdn-h200 200 || bench_rc=1
fi
for version in ${VERSIONS:-}; do
  KIT=.gpu-kit-$version SITE=/tmp/site-$version source scripts/gpu/gpu_kit_install.sh
  rm -f "$OUT/kit-install-$version.log"  # kept only when the install fails (it exits then)
  bench "gdn-h200-vllm-$version" 420 "/tmp/site-$version" || bench_rc=1
done
exit $(( tests_rc || bench_rc ))
