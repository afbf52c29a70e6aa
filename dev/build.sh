#!/usr/bin/env bash
# In-place developer build: compiles the extension modules straight into jaxdnn/, so that
# `PYTHONPATH=<repo> python -m pytest` runs the tree as it is (no pip install). Each git
# worktree gets its own build directory, so several can build at once.
#   PYTHON=python3.12 JAXDNN_CUDA=OFF dev/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build/inplace}
py=$(command -v "${PYTHON:-python3}")
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$root" -B "$build" "${gen[@]}" -DPython_EXECUTABLE="$py" -DCMAKE_BUILD_TYPE=Release \
  -DJAXDNN_CUDA="${JAXDNN_CUDA:-AUTO}" >/dev/null
cmake --build "$build" --parallel
cp "$build"/_cpu*.so "$build"/_build_config.py "$root/jaxdnn/"
rm -f "$root"/jaxdnn/_cuda*.so
if ls "$build"/_cuda*.so >/dev/null 2>&1; then cp "$build"/_cuda*.so "$root/jaxdnn/"; fi
