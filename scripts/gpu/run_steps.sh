# Sourced by the run_*_gpu.sh scripts: the step banner, SKIP="part …", a pytest log's summary lines, and the seconds
# left before DEADLINE (seconds after the script started, default 570: a device call ends at 600).
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
step() { echo; echo "=== $1 ($(date +%T)) ==="; }
summary() {  # pytest's last line, or (a run stopped at its time limit) the verbose result lines so far
  local last
  last=$(grep -E "(passed|failed|errors?)\b.* in [0-9.]+s" "$1" | tail -1)
  echo "${last:-stopped before its summary: $(grep -c " PASSED" "$1") passed, $(grep -c " FAILED" "$1") failed so far}"
  grep -E "^(FAILED|ERROR)" "$1" | head -20
}
script_start=$(date +%s)
seconds_left() { local left=$(( ${DEADLINE:-570} - ($(date +%s) - script_start) )); echo $(( left > 10 ? left : 10 )); }
