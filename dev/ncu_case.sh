#!/usr/bin/env bash
# Where a kernel's warps wait, per SASS instruction: ncu's sections with details (stall reasons,
# memory tables, occupancy), then the source page (instructions executed and stall samples per
# instruction), for one case of dev/kernel_trace.py (its third launch of the kernel).
#   dev/ncu_case.sh KERNEL_REGEX CASE
#   dev/ncu_case.sh activation_kernel act_gelu_exact:bfloat16
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
run=(ncu --clock-control none --kernel-name "regex:$1" --launch-skip 2 --launch-count 1)
app=(python3 dev/kernel_trace.py --run-only "$2")
"${run[@]}" --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section SourceCounters --section Occupancy \
  --section LaunchStats --print-details all "${app[@]}"
echo "=== SASS source page"
"${run[@]}" --section SourceCounters --page source --print-source sass "${app[@]}" | head -1500
