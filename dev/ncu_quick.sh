#!/usr/bin/env bash
# A memory-bound kernel's headline numbers under ncu: duration, throughputs, instructions
# executed, DRAM bytes, occupancy and the warp stall breakdown, for one case of
# dev/kernel_trace.py (its third launch of the kernel, at the GPU's own clocks).
#   dev/ncu_quick.sh KERNEL_REGEX CASE
#   dev/ncu_quick.sh row_bwd_kernel layer_norm_bwd:bfloat16
# (dev/ncu_case.sh adds the per-instruction SASS page.)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
ncu --clock-control none --kernel-name "regex:$1" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --metrics smsp__inst_executed.sum,dram__bytes.sum --print-details all \
  python3 dev/kernel_trace.py --run-only "$2" 2>&1 |
  grep -E -e "Duration|Throughput|Registers|inst_executed|dram__bytes|Warp Cycles" \
    -e "Issued Warp|Occupancy|Stall|Eligible"
