#!/usr/bin/env bash
# Same-call A/B of the norm forward kernels of several git revisions, with dev/norm_fwd_bench.cu.
# The device machine gets the working tree but not the git history, so this runs in two halves:
#
#   dev/ab_trees.sh prepare main wip/norm-merge-teams ...   (here) exports each revision's cc/
#       and its own dev/norm_fwd_bench.cu (the bench builds the kernels' arguments, which change
#       with them) into abtmp/<name>/, and writes abtmp/run.sh;
#   bash abtmp/run.sh [f32 bf16]                           (on the device, in the repo root)
#       builds every tree's bench (column path, and -DSEGMENT) in parallel, then runs them in
#       turn, two rounds, the log in $OUT/ab.log.
#
# abtmp/ must stay untracked and not ignored (so that it travels); delete it before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = prepare ] && [ $# -ge 2 ] || { echo "usage: $0 prepare REV [REV ...]" >&2; exit 2; }
shift
rm -rf abtmp
mkdir -p abtmp
names=()
for rev in "$@"; do
  name=${rev//\//_}
  mkdir -p "abtmp/$name/dev"
  files=(cc dev/norm_fwd_bench.cu)
  git cat-file -e "$rev:dev/event_timing.cuh" 2>/dev/null && files+=(dev/event_timing.cuh)
  git archive "$rev" "${files[@]}" | tar -x -C "abtmp/$name"
  names+=("$name")
done
cat > abtmp/run.sh <<EOF
#!/usr/bin/env bash
# Written by dev/ab_trees.sh for: $*
set -u
OUT=\${OUT:-/tmp/out}
mkdir -p /tmp/ab "\$OUT"
F="-std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90"
for t in ${names[*]}; do
  ( cd "abtmp/\$t" && nvcc \$F -o "/tmp/ab/\$t-col" dev/norm_fwd_bench.cu cc/norm/cuda_row.cu \\
      cc/norm/cuda_segment.cu > "\$OUT/build-\$t-col.log" 2>&1 ) &
  ( cd "abtmp/\$t" && nvcc \$F -DSEGMENT -o "/tmp/ab/\$t-seg" dev/norm_fwd_bench.cu \\
      cc/norm/cuda_row.cu cc/norm/cuda_column.cu > "\$OUT/build-\$t-seg.log" 2>&1 ) &
done
wait
for r in 1 2; do
  for dt in \${@:-f32 bf16}; do
    for path in col seg; do
      for t in ${names[*]}; do
        echo "== round \$r \$dt \$path \$t"
        "/tmp/ab/\$t-\$path" "\$dt" | grep -v "pattern\\|bulk "
      done
    done
  done
done 2>&1 | tee "\$OUT/ab.log"
EOF
chmod +x abtmp/run.sh
echo "abtmp/run.sh ready for: ${names[*]}"
