#!/usr/bin/env bash
# Configures (once) and builds libddp against the pinned PyTorch 2.x wheel
# (deploy/install-torch2.sh) into ./build-torch2: LibTorch 2.x with CUDA and
# NCCL on, whether or not this machine has a GPU (GPU tests then skip with
# their reason). ccache as deploy/build.sh. Extra arguments go to the
# configure step; DDP_BUILD_TARGETS="a b" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-torch2.sh
build=${DDP_TORCH2_BUILD_DIR:-build-torch2}
venv=${DDP_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libddp/torch2}
jobs=${DDP_JOBS:-$(nproc)}
source deploy/ccache-env.sh
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 ]]; then
  # The torch package folder, found without importing torch (fast, quiet).
  python=$(cd "$venv" && pwd)/bin/python
  prefix=$("$python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTorch_ROOT="$prefix" \
    -DDDP_ORACLE_PYTHON="$python" "$@"
fi
targets=()
for t in ${DDP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" ${targets[@]+"${targets[@]}"}
