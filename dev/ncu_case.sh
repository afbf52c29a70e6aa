#!/usr/bin/env bash
# Where a kernel's time goes, under ncu, for one case of dev/kernel_trace.py (its third launch
# of the kernel, at the GPU's own clocks):
#   dev/ncu_case.sh KERNEL_REGEX CASE          sections with details (stall reasons, memory
#                                              tables, occupancy), then the source page
#                                              (instructions executed, stall samples per SASS
#                                              instruction)
#   dev/ncu_case.sh --quick KERNEL_REGEX CASE  the headline lines only: duration, throughputs,
#                                              instructions, DRAM bytes, occupancy, stalls
#   e.g. dev/ncu_case.sh --quick row_bwd_kernel layer_norm_bwd:bfloat16
set -uo pipefail
quick=0
[ "${1:-}" = --quick ] && { quick=1; shift; }
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
run=(ncu --clock-control none --kernel-name "regex:$1" --launch-skip 2 --launch-count 1)
app=(python3 dev/kernel_trace.py --run-only "$2")
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats)
if [ $quick = 1 ]; then
  "${run[@]}" "${sections[@]}" --metrics smsp__inst_executed.sum,dram__bytes.sum \
    --print-details all "${app[@]}" 2>&1 |
    grep -E -e "Duration|Throughput|Registers|inst_executed|dram__bytes|Warp Cycles" \
      -e "Issued Warp|Occupancy|Stall|Eligible"
  exit
fi
"${run[@]}" "${sections[@]}" --section MemoryWorkloadAnalysis --section SourceCounters \
  --print-details all "${app[@]}"
echo "=== SASS source page"
"${run[@]}" --section SourceCounters --page source --print-source sass "${app[@]}" | head -1500
