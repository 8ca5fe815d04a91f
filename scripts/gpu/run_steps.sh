# Sourced by the run_*_gpu.sh scripts: the step banner, SKIP="part …" and a pytest log's summary lines.
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
step() { echo; echo "=== $1 ($(date +%T)) ==="; }
summary() { grep -E "passed|failed|error" "$1" | tail -1; grep -E "^(FAILED|ERROR)" "$1" | head -20; }
