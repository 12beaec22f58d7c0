#!/usr/bin/env bash
# Installs the build tree into a fresh prefix, then configures, builds and runs
# a separate project against it with find_package(ddp CONFIG REQUIRED).
# Usage: install_and_consume.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/ddp_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/ddp/ddp.h"
test -f "$work/prefix/lib/cmake/ddp/ddpConfig.cmake"
if [[ -f "$build/launcher/ddprun" ]]; then test -x "$work/prefix/bin/ddprun"; fi
cmake -S "$src/tests/install/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
# One process: world size 1 still goes through the store, Gloo and the reducer.
port=$(( 20000 + RANDOM % 20000 ))
RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$work/build/consumer"
