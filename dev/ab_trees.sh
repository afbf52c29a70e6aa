#!/usr/bin/env bash
# Same-call A/B of several git revisions' kernels through one single-file CUDA driver (a .cu that
# includes the kernel sources it times and prints its own timings). The device machine gets the
# working tree but not the git history, so this runs in two halves:
#
#   dev/ab_trees.sh prepare DRIVER.cu REV [REV ...]   (here) exports each revision's cc/ into
#       abtmp/<rev>/, beside a copy of the working tree's DRIVER.cu, and writes abtmp/run.sh;
#   bash abtmp/run.sh [ARGS ...]                      (on the device, in the repo root)
#       builds every tree's driver in parallel, then runs them in turn, two rounds, each with
#       ARGS; the log in $OUT/ab.log.
#
# abtmp/ must stay untracked and not ignored (so that it travels); delete it before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = prepare ] && [ $# -ge 3 ] || {
  echo "usage: $0 prepare DRIVER.cu REV [REV ...]" >&2; exit 2; }
driver=$2
shift 2
rm -rf abtmp
mkdir -p abtmp
names=()
for rev in "$@"; do
  name=${rev//\//_}
  mkdir -p "abtmp/$name"
  git archive "$rev" cc | tar -x -C "abtmp/$name"
  cp "$driver" "abtmp/$name/driver.cu"
  names+=("$name")
done
cat > abtmp/run.sh <<RUN
#!/usr/bin/env bash
# Written by dev/ab_trees.sh for $driver at: $*
set -u
OUT=\${OUT:-/tmp/out}
mkdir -p /tmp/ab "\$OUT"
F="-std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90"
for t in ${names[*]}; do
  ( cd "abtmp/\$t" && nvcc \$F -o "/tmp/ab/\$t" driver.cu > "\$OUT/build-\$t.log" 2>&1 ) &
done
wait
for r in 1 2; do
  for t in ${names[*]}; do
    echo "== round \$r \$t"
    "/tmp/ab/\$t" "\$@"
  done
done 2>&1 | tee "\$OUT/ab.log"
RUN
chmod +x abtmp/run.sh
echo "abtmp/run.sh ready for: ${names[*]}"
