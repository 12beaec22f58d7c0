#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test; then
# the same against LibTorch 2.x (build-torch2); then the sanitized build
# (build-san): the unit and data tests and one multi-process DDP test under
# AddressSanitizer and UBSan, and every fuzz harness for DDP_FUZZ_SECONDS on
# its corpus (fuzz/README.md). What runs where, and what each part costs on a
# 2-core machine: docs/testing.md. One part at a time: a build compiling at
# the lowest priority beside a suite made its tests 1.75 times slower.
# DDP_SKIP_SANITIZED=1 skips the sanitized part, for a quick local run only.
set -euo pipefail
cd "$(dirname "$0")/.."
# step WHAT COMMAND...: runs COMMAND, then says how long it took.
step() {
  local what=$1 started=$SECONDS
  shift
  "$@"
  echo "run-tests: $what took $((SECONDS - started)) s"
}
step "installing what is missing" deploy/install-deps.sh
# The torch 2.x environment (about 600 MB to download on a new machine; a
# second's check when present) is installed while the 1.13 build compiles:
# it waits on the network, the build on the CPU.
torch2_log=$(mktemp)
torch2_pid=
if [[ "${DDP_SKIP_TORCH2:-0}" != 1 ]]; then
  deploy/install-torch2.sh >"$torch2_log" 2>&1 &
  torch2_pid=$!
fi
trap '[[ -n "$torch2_pid" ]] && kill "$torch2_pid" 2>/dev/null; rm -f "$torch2_log"' EXIT
# LibTorch 1.13: the test programs and what their tests start; the other
# examples compile in the 2.x build below.
DDP_BUILD_TARGETS=ddp_test_programs step "the LibTorch 1.13 build" deploy/build.sh
# Four tests at a time, longest first: a 2-core machine stays busy (at -j 2
# the suite kept 1.6 cores busy; its tests wait on one another's ranks,
# sockets and timeouts), and no long test starts last to run alone at the end.
# ctest orders by the times its last run recorded in the build's
# Testing/Temporary/CTestCostData.txt; a clean clone has none, so each build's
# is kept beside the oracle cache (suite BUILD_DIR runs BUILD_DIR's tests with
# them; the first run, or DDP_TEST_COST=0, takes ctest's order). No test
# depends on its neighbours or on running before or after another
# (docs/testing.md, "Tests that run at once").
# The PyTorch oracles' results are cached by everything they depend on, as
# ccache caches compiles (tests/support/oracle_cache.py; DDP_ORACLE_CACHE=0
# runs PyTorch every time).
ctest_args=(--output-on-failure -j "${DDP_TEST_JOBS:-4}" --timeout 600)
cost_dir=${XDG_CACHE_HOME:-$HOME/.cache}/libddp/ctest-cost
suite() {  # suite BUILD_DIR [ctest args...]
  local dir=$1 rc=0 kept
  shift
  kept=$cost_dir/$(basename "$dir").txt
  if [[ "${DDP_TEST_COST:-1}" != 0 && -f "$kept" ]]; then
    mkdir -p "$dir/Testing/Temporary"
    cp "$kept" "$dir/Testing/Temporary/CTestCostData.txt"
  fi
  ctest --test-dir "$dir" "${ctest_args[@]}" "$@" || rc=$?
  if [[ "${DDP_TEST_COST:-1}" != 0 && -f "$dir/Testing/Temporary/CTestCostData.txt" ]]; then
    mkdir -p "$cost_dir" && cp "$dir/Testing/Temporary/CTestCostData.txt" "$kept.tmp" && mv "$kept.tmp" "$kept"
  fi
  return "$rc"
}
# LibTorch 1.13: all but the end_to_end tests, which the 2.x build runs (below).
step "its tests" suite "${DDP_BUILD_DIR:-build}" -LE end_to_end

# LibTorch 2.x: the pinned PyTorch wheel's (CUDA and NCCL on; no GPU needed,
# the GPU tests skip with their reason), with PyTorch 2.x's Python as the
# parity oracle (docs/gpu.md). Which tests run where (docs/testing.md):
# - both builds: everything that touches Torch, c10d or the reducer (DDP,
#   hooks, Join, ZeRO, AMP, the data kit, checkpoints, mpirun, the namespace
#   hosts), ddprun's rendezvous and store (its store module links c10d's TCPStore), and
#   the installed package (its CMake config finds either LibTorch);
# - the 2.x build only, label end_to_end: the examples trained through
#   ddprun, resumed, killed and restarted, and DDP's scenarios again over the
#   mpi backend: whole runs whose every LibTorch call the tests of both
#   builds check one by one (tests/CMakeLists.txt, END_TO_END);
# - the first build only, label torch_free: what no LibTorch version changes
#   (ddprun starting, watching, stopping and restarting workers, its command
#   line, Slurm host lists, the launch environment, the layout check);
# - the first build only, label cluster: the Slurm job templates on a real
#   Slurm, which check the templates and Slurm's environment, not LibTorch.
# DDP_SKIP_TORCH2=1 skips this part, for a quick local run only.
if [[ "${DDP_SKIP_TORCH2:-0}" != 1 ]]; then
  started=$SECONDS
  wait "$torch2_pid" || { cat "$torch2_log"; echo "run-tests: installing torch 2.x failed (above)"; exit 1; }
  torch2_pid=
  cat "$torch2_log"
  echo "run-tests: the torch 2.x environment was ready $((SECONDS - started)) s after the 1.13 suite"
  # The test programs and what their tests start (every example); the
  # benchmarks compile where they are run (bench/, deploy/gpu-kit.sh).
  DDP_BUILD_TARGETS=ddp_test_programs step "the LibTorch 2.x build" deploy/build-torch2.sh
  step "its tests" suite "${DDP_TORCH2_BUILD_DIR:-build-torch2}" -LE 'cluster|torch_free'
else
  echo "run-tests: DDP_SKIP_TORCH2=1: not building and testing against LibTorch 2.x (CI does), nor the end_to_end tests"
fi

if [[ "${DDP_SKIP_SANITIZED:-0}" == 1 ]]; then
  echo "run-tests: DDP_SKIP_SANITIZED=1: not running the sanitized tests and the fuzzers (CI runs them)"
  exit 0
fi
step "the sanitized build" deploy/build-san.sh
# The sanitizers' options come with the tests (cmake/sanitize.cmake).
step "its tests" suite "${DDP_SAN_BUILD_DIR:-build-san}"
echo "run-tests: everything passed in $SECONDS s"
