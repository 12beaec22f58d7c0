#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
# Multi-process tests start up to 4 ranks each; two tests at a time keep a
# 2-core machine busy without starving the ranks.
ctest --test-dir "${DDP_BUILD_DIR:-build}" --output-on-failure -j 2 --timeout 600
