#!/usr/bin/env bash
# One device call for the Gated DeltaNet kernels: build the extension for the GPU at hand, run the GDN GPU tests
# (4 workers), summarise their errors against the float64 references, run the GDN benchmark. Logs and the table go
# to $OUT. Usage: OUT=... COMMIT=<hash> bash benchmarks/run_gdn_gpu.sh
set -uo pipefail
source benchmarks/gpu_build.sh
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
timeout 80 python3 benchmarks/bench_gdn.py --out "$OUT/gdn-h200.md" --commit "${COMMIT:-uncommitted}" > "$OUT/gdn-bench.log" 2>&1
bench_rc=$?
tail -3 "$OUT/gdn-bench.log"
[[ -f "$OUT/gdn-h200.md" ]] && cat "$OUT/gdn-h200.md"
exit $(( tests_rc || bench_rc ))
