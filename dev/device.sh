#!/usr/bin/env bash
# One call on the GPU machine: build in place, then run the named steps, logging everything
# under $OUT (logs and benchmark results come back as one tarball, results.tgz).
#   dev/device.sh tests memcheck bench examples
# Steps:
#   tests        the whole pytest suite (GPU tests included)
#   gpu-tests    only tests parametrised on the GPU (-k gpu)
#   memcheck     compute-sanitizer memcheck over dev/sanitize.py (every CUDA kernel, small shapes)
#   racecheck    compute-sanitizer racecheck over the same
#   bench        every benchmarks/bench_*.py except the CPU ones
#   examples     CNN images/s on the GPU at batch 256 (float32, bfloat16) and --compare-lax
#   <name>=<cmd> anything else, run with bash -c and logged as <name>.log
# Every step is killed, with its whole process group, after STEP_TIMEOUT seconds (default 300):
# a kernel that hangs (an mbarrier waiting for bytes that never come) ends its step, not the
# device call. The build has its own limit, BUILD_TIMEOUT (default 400; a fresh build takes
# ~115 s), so that a short STEP_TIMEOUT does not kill it (it did once, and the call was lost).
set -uo pipefail
# This machine has a GPU: a GPU test that cannot run (no GPU seen, no CUDA module) fails instead
# of skipping (tests/conftest.py), and the pytest summary counts the GPU tests that ran.
export JAXDNN_REQUIRE_GPU=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
NOPRE="env XLA_PYTHON_CLIENT_PREALLOCATE=false"  # for parallel test processes
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
summary=()
step() {  # step NAME COMMAND...: run, log, remember the last line
  local name=$1; shift
  local t0=$SECONDS limit=${STEP_TIMEOUT:-300}
  [ "$name" = build ] && limit=${BUILD_TIMEOUT:-400}
  echo "=== $name ($(date +%T))"
  timeout -k 10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -1 | cut -c1-150)
  summary+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$last")")
  echo "    rc=$rc: $last"
}

step build env PYTHON=python3 dev/build.sh
python3 -c "import jaxdnn, jax; print(jaxdnn.build_info(), jax.devices())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

for s in "$@"; do
  case $s in
    tests) step tests $NOPRE python3 -m pytest -q -n 4 -p no:cacheprovider ;;
    gpu-tests) step gpu-tests $NOPRE python3 -m pytest -q -n 4 -p no:cacheprovider -k gpu ;;
    memcheck) step memcheck $NOPRE compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 dev/sanitize.py ;;
    racecheck) step racecheck $NOPRE compute-sanitizer --tool racecheck --error-exitcode 1 \
        python3 dev/sanitize.py ;;
    bench)
      for b in benchmarks/bench_*.py; do
        case $b in *_cpu.py) continue ;; esac
        step "$(basename "$b" .py)" python3 "$b"
      done ;;
    examples)
      for dt in float32 bfloat16; do
        step "cnn-$dt" python3 -m jaxdnn.examples.train_cnn --batch-size 256 --epochs 10 \
          --dtype "$dt" --no-progress --plot ""
        step "cmp-$dt" python3 -m jaxdnn.examples.train_cnn --batch-size 256 --compare-lax \
          --compare-steps 60 --dtype "$dt" --no-progress
      done ;;
    *=*) step "${s%%=*}" bash -c "${s#*=}" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done

cp -r benchmarks/results "$OUT/logs/results" 2>/dev/null
tar -czf "$OUT/results.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "=== summary"
printf '%s\n' "${summary[@]}"
