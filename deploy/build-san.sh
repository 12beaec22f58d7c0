#!/usr/bin/env bash
# Configures (once) and builds ./build-san: libddp, the unit and data tests
# and one multi-process DDP test with AddressSanitizer and UBSan, and the
# libFuzzer harnesses (fuzz/), all with clang so that one build gives both.
# ccache as deploy/build.sh, so a warm CI run recompiles nothing. Extra
# arguments go to the configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DDP_SAN_BUILD_DIR:-build-san}
jobs=${DDP_JOBS:-$(nproc)}
source deploy/ccache-env.sh
# This build has debug info (-g, for the sanitizers' reports), and ccache
# then hashes the working directory too: without this, another checkout or
# build directory would miss every entry (measured: 414 s instead of a warm
# build). The price is a compilation directory in the debug info that may
# be another checkout's; the reports name files relative to it either way.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 ]]; then
  # RelWithDebInfo, made -O1 with line tables by cmake/sanitize.cmake: the
  # lines of a sanitizer's report named at the least compile time. No
  # examples, benchmarks or mpi backend: nothing sanitized runs them.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DDDP_SANITIZE=ON -DDDP_FUZZ=ON -DDDP_BUILD_EXAMPLES=OFF -DDDP_BUILD_BENCH=OFF -DDDP_WITH_MPI=OFF "$@"
fi
cmake --build "$build" -j "$jobs"
