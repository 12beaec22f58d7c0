#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test; then
# the sanitized build (build-san): the unit and data tests and one
# multi-process DDP test under AddressSanitizer and UBSan, and every fuzz
# harness for DDP_FUZZ_SECONDS on its corpus (fuzz/README.md).
# DDP_SKIP_SANITIZED=1 skips the second part, for a quick local run only.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
# Multi-process tests start up to 4 ranks each; two tests at a time keep a
# 2-core machine busy without starving the ranks.
ctest --test-dir "${DDP_BUILD_DIR:-build}" --output-on-failure -j 2 --timeout 600

if [[ "${DDP_SKIP_SANITIZED:-0}" == 1 ]]; then
  echo "run-tests: DDP_SKIP_SANITIZED=1: not running the sanitized tests and the fuzzers (CI runs them)"
  exit 0
fi
deploy/build-san.sh
# The sanitizers' options come with the tests (cmake/sanitize.cmake).
ctest --test-dir "${DDP_SAN_BUILD_DIR:-build-san}" --output-on-failure -j 2 --timeout 600
