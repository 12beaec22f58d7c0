#!/usr/bin/env bash
# Installs the pinned PyTorch 2.x wheel from PyPI (LibTorch with CUDA and
# NCCL, and its Python: the 2.x oracle of the parity tests) into a virtual
# environment outside the tree, ~/.cache/libddp/torch2 (DDP_TORCH2_VENV), so
# that every checkout on the machine shares it as it shares ccache's cache.
# A warm run checks the versions and installs nothing; pip's cache keeps a
# re-run after removing it fast (about 70 s). The pin is the GPU machine's PyTorch (docs/gpu.md
# says how to check it there): what is built here runs there.
# Usage: deploy/install-torch2.sh     (DDP_TORCH2_VERSION overrides the pin)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${DDP_TORCH2_VERSION:-2.11.0}
numpy_version=2.4.6
# TensorBoard, to read the training kit's event files back in the tests
# (EventAccumulator) and to look at runs (`tensorboard --logdir runs`).
tensorboard_version=${DDP_TENSORBOARD_VERSION:-2.21.0}
venv=${DDP_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libddp/torch2}

if [[ -x "$venv/bin/python" ]] &&
  "$venv/bin/python" - "$version" "$numpy_version" "$tensorboard_version" <<'PY' 2>/dev/null; then
import sys, importlib.metadata as md
sys.exit(md.version("torch").split("+")[0] != sys.argv[1] or md.version("numpy") != sys.argv[2]
         or md.version("tensorboard") != sys.argv[3])
PY
  echo "install-torch2: torch $version, numpy $numpy_version and tensorboard $tensorboard_version present in $venv"
  exit 0
fi

# Debian's python3 makes the environment (python3-venv brings ensurepip).
status=$(dpkg-query -W -f='${db:Status-Abbrev}' python3-venv 2>/dev/null || true)
if [[ "$status" != ii* ]]; then
  sudo=""
  ((EUID == 0)) || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends python3-venv || {
    $sudo apt-get update
    $sudo apt-get install -y --no-install-recommends python3-venv
  }
fi
[[ -x "$venv/bin/python" ]] || { mkdir -p "$(dirname "$venv")" && /usr/bin/python3 -m venv "$venv"; }
echo "install-torch2: installing torch $version (with its CUDA runtime wheels), numpy $numpy_version and tensorboard $tensorboard_version into $venv"
"$venv/bin/pip" install --progress-bar off --disable-pip-version-check "torch==$version" "numpy==$numpy_version" \
  "tensorboard==$tensorboard_version"
