#!/usr/bin/env bash
# Where a conv GEMM kernel's warps wait: ncu's warp-state (stall reasons per issued
# instruction), scheduler, compute and memory sections, and the source lines with the most
# stall samples, for each case; one log per case under $OUT (or /tmp/out).
#   dev/profile.sh "HW CIN COUT K DIR ALGO KERNEL_REGEX [GROUPS]" ...
#   dev/profile.sh "28 128 128 3 fwd implicit_precomp_gemm wgmma_kernel" \
#                  "14 256 256 3 fwd implicit_gemm halo_kernel"
# The third launch of the matching kernel is profiled (the first two are warm-up), with the
# GPU's own clocks (ncu would otherwise lock them at base). Needs a build (dev/device.sh does
# one).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section SourceCounters --section Occupancy)
for case in "$@"; do
  read -r hw cin cout k dir algo kernel groups <<< "$case"
  log="$OUT/logs/ncu-$hw-$cin-$cout-$k-$dir-$algo.log"
  run=(ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1
       "${sections[@]}")
  app=(python3 dev/profile_conv.py --hw "$hw" --cin "$cin" --cout "$cout" --k "$k" --dir "$dir"
       --algo "$algo" --groups "${groups:-1}")
  echo "=== $case"
  # The stall-reason breakdown is printed only with the sections' details.
  timeout -k 10 300 "${run[@]}" --print-details all "${app[@]}" > "$log" 2>&1 ||
    timeout -k 10 300 "${run[@]}" "${app[@]}" > "$log" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Warp Cycles Per Issued|Stall|stall" "$log" | head -40
done
