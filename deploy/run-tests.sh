#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test; then
# the same against LibTorch 2.x (build-torch2); then the sanitized build
# (build-san): the unit and data tests and one multi-process DDP test under
# AddressSanitizer and UBSan, and every fuzz harness for DDP_FUZZ_SECONDS on
# its corpus (fuzz/README.md). What runs where, and what each part costs on a
# 2-core machine: docs/testing.md.
# DDP_SKIP_TORCH2=1 and DDP_SKIP_SANITIZED=1 skip those parts, for a quick
# local run only (CI runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh

# The next build compiles while a suite runs, at the lowest priority: the
# tests take the cores when they want them (they leave a fifth idle, waiting
# on processes, sockets and timeouts), the build takes the rest. Its output
# is shown when it is waited for, so the log stays in order.
background_pid=
background_log=
start_background() {  # start_background NAME COMMAND...
  background_log=$(mktemp "/tmp/ddp-$1-XXXXXX.log")
  # A process group of its own, so that a failing suite stops it (below).
  setsid nice -n 19 "${@:2}" >"$background_log" 2>&1 &
  background_pid=$!
}
trap '[[ -n "$background_pid" ]] && { kill -- -"$background_pid" || kill "$background_pid"; } 2>/dev/null; true' EXIT
wait_background() {
  local rc=0
  wait "$background_pid" || rc=$?
  background_pid=
  cat "$background_log"
  rm -f "$background_log"
  return "$rc"
}

torch2=1
[[ "${DDP_SKIP_TORCH2:-0}" == 1 ]] && torch2=0
sanitized=1
[[ "${DDP_SKIP_SANITIZED:-0}" == 1 ]] && sanitized=0
((torch2)) && start_background torch2 deploy/build-torch2.sh
((!torch2 && sanitized)) && start_background san deploy/build-san.sh

# Multi-process tests start up to 4 ranks each; two tests at a time keep a
# 2-core machine busy without starving the ranks (they also pass at -j4).
# Everything in the first build, LibTorch 1.13: the whole suite.
ctest --test-dir "${DDP_BUILD_DIR:-build}" --output-on-failure -j 2 --timeout 600

# LibTorch 2.x: the pinned PyTorch wheel's (CUDA and NCCL on; no GPU needed,
# the GPU tests skip with their reason), with PyTorch 2.x's Python as the
# parity oracle (docs/gpu.md). Which tests run where (docs/testing.md):
# - both builds: everything that touches Torch, c10d or the reducer (DDP,
#   hooks, Join, ZeRO, AMP, the data kit, the examples, mpirun, the namespace
#   hosts), ddprun's rendezvous and store (ddprun links c10d's TCPStore), and
#   the installed package (its CMake config finds either LibTorch);
# - the first build only, label torch_free: what no LibTorch version changes
#   (ddprun starting, watching, stopping and restarting workers, its command
#   line, Slurm host lists, the launch environment, the layout check);
# - the first build only, label cluster: the Slurm job templates on a real
#   Slurm, which check the templates and Slurm's environment, not LibTorch.
if ((torch2)); then
  wait_background
  ((sanitized)) && start_background san deploy/build-san.sh
  ctest --test-dir "${DDP_TORCH2_BUILD_DIR:-build-torch2}" --output-on-failure -j 2 --timeout 600 -LE 'cluster|torch_free'
else
  echo "run-tests: DDP_SKIP_TORCH2=1: not building and testing against LibTorch 2.x (CI does)"
fi

if ((!sanitized)); then
  echo "run-tests: DDP_SKIP_SANITIZED=1: not running the sanitized tests and the fuzzers (CI runs them)"
  exit 0
fi
wait_background
# The sanitizers' options come with the tests (cmake/sanitize.cmake).
ctest --test-dir "${DDP_SAN_BUILD_DIR:-build-san}" --output-on-failure -j 2 --timeout 600
