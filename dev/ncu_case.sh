#!/usr/bin/env bash
# ncu_case.sh KERNEL_REGEX CASE  -> details + sass source page
k=$1; c=$2
sec=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section Occupancy --section LaunchStats)
ncu --clock-control none --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 "${sec[@]}" --print-details all python3 dev/kernel_trace.py --run-only "$c"
echo "=== SASS source page"
ncu --clock-control none --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --section SourceCounters --page source --print-source sass python3 dev/kernel_trace.py --run-only "$c" | head -1500
