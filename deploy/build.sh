#!/usr/bin/env bash
# Configures (once) and builds libddp into ./build with ccache; incremental
# when warm. Extra arguments go to the configure step, e.g. -DDDP_BUILD_BENCH=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DDP_BUILD_DIR:-build}
jobs=${DDP_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths under the checkout hash as relative ones: a fresh clone elsewhere (CI)
# or a git worktree hits the same cache entries.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$build" -j "$jobs"
