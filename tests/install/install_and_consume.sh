#!/usr/bin/env bash
# Installs the build tree into a fresh prefix, moves the prefix (the package
# must be relocatable), then configures, builds and runs separate projects
# against it with find_package(ddp CONFIG REQUIRED):
#   consumer        ddp::ddp only, with Boost and zlib hidden from CMake: the
#                   README's code snippet, which must equal its main.cpp
#   train_consumer  ddp::train
# The installed ddprun runs a rendezvous on its store module.
# Usage: install_and_consume.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/ddp_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/staging" >/dev/null
mv "$work/staging" "$work/prefix"
prefix=$work/prefix
for f in include/ddp/ddp.h include/ddp/train.h include/ddp/errors.h lib/cmake/ddp/ddpConfig.cmake \
         share/doc/ddp/api.md share/doc/ddp/launcher.md share/doc/ddp/clusters.md share/doc/ddp/consumer/CMakeLists.txt; do
  test -f "$prefix/$f" || { echo "missing from the installed package: $f"; exit 1; }
done
# Every page and image the installed docs link to is installed beside them
# (links into the source tree, such as ../bench/results/, stay the repository's).
for page in "$prefix"/share/doc/ddp/*.md; do
  for target in $(grep -o '](\([A-Za-z_]*\.md\|img/[^)#]*\|docs/[^)#]*\)[)#]' "$page" | sed 's/^](//; s/[)#]$//' | sort -u); do
    test -e "$prefix/share/doc/ddp/$target" ||
      { echo "the installed $(basename "$page") links $target, which is not installed"; exit 1; }
  done
done
# Private headers stay private.
if find "$prefix/include" -name 'c10d_compat.h' -o -name 'torch_pickle.h' -o -name 'usage_check.h' | grep -q .; then
  echo "a private header was installed:"; find "$prefix/include" -name '*.h' | sort; exit 1
fi
# Relocatable: no path of the staging prefix or of a Torch library in the exported targets.
if grep -n "$work/staging\|libc10\.so\|libtorch[a-z_]*\.so" "$prefix"/lib/cmake/ddp/*.cmake; then
  echo "the exported package names absolute paths (above)"; exit 1
fi
if [[ -f "$build/launcher/ddprun" ]]; then test -x "$prefix/bin/ddprun"; "$prefix/bin/ddprun" --version; fi

launcher=$(command -v ccache || true)
# ccache sees the paths under $work (a new folder each run) as relative ones,
# so a second run of this test finds the consumers compiled already, from
# whichever checkout: their sources are copied there too.
export CCACHE_BASEDIR=$work
cp -R "$src/tests/install/consumer" "$src/tests/install/train_consumer" "$work/"
# The headers were installed a moment ago: without this ccache takes their
# fresh times for a file being written and compiles again, every run.
export CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime
# The consumer finds the LibTorch this build used, as a user names theirs
# (docs/gpu.md): Torch_ROOT when the build had one (a pip wheel, a zip).
torch_root=$(sed -n 's/^Torch_ROOT:[A-Z]*=//p' "$build/CMakeCache.txt")
torch_args=()
[[ -n "$torch_root" ]] && torch_args=(-DTorch_ROOT="$torch_root")
configure() {  # configure DIR [cmake args...]
  local dir=$1 started=$SECONDS; shift
  cmake -S "$work/$dir" -B "$work/build-$dir" -DCMAKE_PREFIX_PATH="$prefix" "${torch_args[@]}" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" "$@" >"$work/$dir.log" 2>&1 ||
    { cat "$work/$dir.log"; echo "configuring $dir failed"; exit 1; }
  local configured=$SECONDS
  cmake --build "$work/build-$dir" -j 2 >>"$work/$dir.log" 2>&1 ||
    { cat "$work/$dir.log"; echo "building $dir failed"; exit 1; }
  echo "$dir: configured in $((configured - started)) s, built in $((SECONDS - configured)) s"
}
# The README's snippet is the consumer's main.cpp (after its opening comment),
# so it compiles as it is without a program of its own.
awk '/^```cpp/{inside=1; next} /^```/{if (inside) exit} inside' "$src/README.md" >"$work/readme_snippet.cpp"
test -s "$work/readme_snippet.cpp" || { echo "no \`\`\`cpp snippet in README.md"; exit 1; }
sed '1,/^[^/]/{/^\/\//d}' "$work/consumer/main.cpp" | diff -u "$work/readme_snippet.cpp" - ||
  { echo "README.md's snippet (-) differs from tests/install/consumer/main.cpp (+) past its opening comment"; exit 1; }
configure consumer -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON
configure train_consumer

# One process each: world size 1 still goes through the store, Gloo and the reducer.
# Its store's port: below the kernel's ephemeral range, where other tests'
# reserved ports (tests/support/reserved_port.h) and every outgoing
# connection's port lie, and above the ports libddp derives from job ids
# (15000-29999). Another process may still hold it (this test of the other
# build, run at the same moment), so a run that finds its port in use is
# run again on another.
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
((ephemeral_low > 31000)) || ephemeral_low=40000  # a machine with a wider range: retries must do
run() {
  local attempt port out
  for attempt in 1 2 3 4 5; do
    port=$((30000 + RANDOM % (ephemeral_low - 30000)))
    if out=$(RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${@//@PORT@/$port}" 2>&1); then
      printf '%s\n' "$out"
      return 0
    fi
    [[ "$out" == *"already in use"* ]] || break
    echo "$(basename "$1"): port $port was in use (attempt $attempt); trying another" >&2
  done
  printf '%s\n' "$out"
  echo "$(basename "$1") failed"
  return 1
}
run "$work/build-consumer/consumer"
# The installed ddprun finds and loads its store module (lib/ddprun/) for a
# rendezvous on a store: one node of a c10d group, at the port run() picks.
if [[ -f "$build/launcher/ddprun" ]]; then
  run "$prefix/bin/ddprun" --nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:@PORT@ --nproc-per-node 1 true
fi
run "$work/build-train_consumer/train_consumer"
