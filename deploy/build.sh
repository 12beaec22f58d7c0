#!/usr/bin/env bash
# Configures (once) and builds libddp into ./build with ccache; incremental
# when warm. Extra arguments go to the configure step, e.g. -DDDP_BUILD_BENCH=OFF.
# DDP_BUILD_TARGETS="ddprun lenet_fmnist" builds those targets (and what they
# link) instead of everything: deploy/run-main.sh does, and run-tests.sh
# builds ddp_test_programs (every test program and what its tests start).
# The test programs of whole runs (DDP_END_TO_END_TESTS) are left out here:
# the test command runs them against LibTorch 2.x (build-torch2.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DDP_BUILD_DIR:-build}
jobs=${DDP_JOBS:-$(nproc)}
source deploy/ccache-env.sh
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_END_TO_END_TESTS=OFF "$@"
fi
targets=()
for t in ${DDP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
# ${a[@]+"${a[@]}"}: an empty array under set -u is an unbound variable in bash < 4.4.
cmake --build "$build" -j "$jobs" ${targets[@]+"${targets[@]}"}
