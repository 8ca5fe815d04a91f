#!/usr/bin/env bash
# One device call (carry ["dist"]): where a short attention decode call's time goes — event times of
# scripts/gpu/attention_fixed_cost.py, then ncu's duration and warp stalls of the same kernels (1 and 128 cached
# tokens). Writes $OUT/fixed-cost.txt and $OUT/fixed-cost-ncu.txt.
set -uo pipefail
source scripts/gpu/gpu_build.sh
python3 scripts/gpu/attention_fixed_cost.py 2>&1 | tee "$OUT/fixed-cost.txt"
ncu --clock-control none -k regex:paged_attention --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 scripts/gpu/attention_fixed_cost.py --ncu > "$OUT/fixed-cost-ncu.txt" 2>&1
grep -E "paged_attention|Duration|Elapsed Cycles|stalled|Warp Cycles Per Issued|No Eligible" \
  "$OUT/fixed-cost-ncu.txt" | head -60
