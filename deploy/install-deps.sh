#!/usr/bin/env bash
# Installs the Debian 12 packages libddp needs, and only those missing:
# a warm machine pays one dpkg-query and no apt-get at all.
# Usage: deploy/install-deps.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  # build
  cmake g++ make ccache pkg-config
  # LibTorch 1.13 (CPU, c10d + Gloo) and the headers c10d's Gloo backend includes
  libtorch-dev libgloo-dev
  # PyTorch itself, for the parity test and the benchmarks against PyTorch's DDP
  python3-torch
  # launcher command line, tests
  libboost-program-options-dev libgtest-dev
  # data and charts for the examples
  zlib1g-dev dataset-fashion-mnist gnuplot-nox
  # multi-node tests (network namespaces, veth, tc) and process inspection
  iproute2 procps
  # the Slurm job templates' tests: a real two-node Slurm (slurmctld, slurmd)
  # with MUNGE authentication, nodes entered with nsenter/unshare (util-linux)
  slurm-wlm munge util-linux
  # the mpi backend (CMake finds Open MPI and builds it in) and mpirun for its
  # tests and for launching across hosts without MASTER_ADDR
  libopenmpi-dev openmpi-bin
  # the sanitized build and the fuzz harnesses (deploy/build-san.sh, fuzz/):
  # clang, and libFuzzer and the sanitizer runtimes for clang 14
  # (libclang_rt.fuzzer-x86_64.a, libclang_rt.asan-x86_64.a)
  clang libclang-rt-14-dev
  # the training kit's TensorBoard event files: protoc for the message code
  # (libprotobuf-dev comes with libtorch-dev; named here all the same)
  protobuf-compiler libprotobuf-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if ((EUID != 0)); then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# A stale package list makes apt-get fail to find versions: refresh once if so.
if ! $sudo apt-get install -y --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
