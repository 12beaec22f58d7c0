#!/usr/bin/env bash
# The main job: installs what is missing, builds what it runs, and trains
# LeNet on Fashion-MNIST with 2 worker processes started by ddprun over Gloo.
# Results land in runs/main/ (metrics.csv, charts, log, final model).
# Extra arguments go to the training program, e.g. --epochs 10.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
# Only what this job runs: the libraries, ddprun and the example (the tests
# are run-tests.sh's).
DDP_BUILD_TARGETS="ddprun lenet_fmnist" deploy/build.sh
build=${DDP_BUILD_DIR:-build}
exec "$build/launcher/ddprun" --nproc-per-node "${DDP_NPROC:-2}" \
  "$build/examples/lenet_fmnist/lenet_fmnist" --run-dir runs/main --epochs 3 "$@"
