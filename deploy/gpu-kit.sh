#!/usr/bin/env bash
# Carries the LibTorch 2.x build to a GPU machine without internet access,
# and runs its GPU checks there (docs/gpu.md, "On a GPU machine without
# internet access").
#
#   deploy/gpu-kit.sh pack    here: .deps/gpu-kit/ (stripped programs of
#                             build-torch2/, the libraries they need beyond
#                             glibc and the torch wheel, Fashion-MNIST)
#   deploy/gpu-kit.sh run     there, in a copy of this tree with .deps/gpu-kit:
#                             the GPU tests, the examples through ddprun (once
#                             on a c10d store's rendezvous), the input path
#                             against fixed data (bench/run_input_bench.py),
#                             AMP against float32 for both implementations at
#                             192 px, and bench/run_gpu_bench.py; results
#                             under $OUT (or ./gpu-out). GPU_KIT_EXAMPLES,
#                             GPU_KIT_INPUT, GPU_KIT_AMP, GPU_KIT_BENCH=0 skip
#                             a part; about 8 minutes in all on one H100.
#
# The GPU machine's own torch (2.11, the pinned version) provides LibTorch,
# CUDA and NCCL: LD_LIBRARY_PATH points at its torch/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=.deps/gpu-kit
programs=(launcher/ddprun launcher/ddprun-store.so bench/ddp_bench_lenet tests/gpu/ddp_gpu_tests tests/gpu/ddp_gpu_worker
  tests/comm/ddp_dist_worker tests/libddp_rank_fork.so examples/lenet_fmnist/lenet_fmnist
  examples/resnet18_fmnist/resnet18_fmnist)

pack() {
  local build=${DDP_TORCH2_BUILD_DIR:-build-torch2}
  deploy/build-torch2.sh  # everything, the benchmark among it (the test command builds no benchmark)
  rm -rf "$kit"
  mkdir -p "$kit/build-torch2" "$kit/lib" "$kit/lib-std" "$kit/data"
  for p in "${programs[@]}"; do
    mkdir -p "$kit/build-torch2/$(dirname "$p")"
    strip -o "$kit/build-torch2/$p" "$build/$p"
  done
  # Every library the programs load that is neither glibc's nor the wheel's.
  for p in "${programs[@]}"; do ldd "$build/$p"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -e '/torch/lib/' -e '/nvidia/' -e 'lib\(c\|m\|dl\|rt\|pthread\|util\|resolv\)\.so' \
      -e 'ld-linux' | while read -r lib; do
    case "$(basename "$lib")" in
      libstdc++.so.*|libgcc_s.so.*) cp -L "$lib" "$kit/lib-std/" ;;
      *) cp -L "$lib" "$kit/lib/" ;;
    esac
  done
  cp -L /usr/share/datasets/fashion-mnist/*.gz "$kit/data/"
  du -sh "$kit"
}

run() {
  local out=${OUT:-$PWD/gpu-out}
  mkdir -p "$out"
  exec > >(tee "$out/gpu-kit.log") 2>&1
  nvidia-smi || true
  local py=""
  for c in python3 python /usr/bin/python3 /opt/conda/bin/python /usr/local/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then py=$(command -v "$c"); break; fi
  done
  [[ -n "$py" ]] || { echo "gpu-kit: no Python with torch on this machine"; exit 1; }
  "$py" -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")' || true
  local torch_lib
  torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  # The test programs find the build's programs and the tree's scripts from
  # their own place (tests/support/located.h): build-torch2/ beside the tree.
  rm -rf build-torch2 && cp -a "$kit/build-torch2" build-torch2
  export LD_LIBRARY_PATH="$torch_lib:$PWD/$kit/lib"
  if ldd build-torch2/tests/gpu/ddp_gpu_tests | grep -q 'GLIBCXX.*not found\|libstdc++.*not found'; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/$kit/lib-std"
  fi
  ldd build-torch2/tests/gpu/ddp_gpu_tests | grep -i 'not found' && echo "gpu-kit: libraries missing (above)"
  export DDP_ORACLE_PYTHON="$py" OMP_NUM_THREADS=4
  echo "== GPU tests"
  build-torch2/tests/gpu/ddp_gpu_tests --gtest_output="xml:$out/gpu_tests.xml" || echo "gpu-kit: GPU tests failed"
  if [[ "${GPU_KIT_EXAMPLES:-1}" == 1 ]]; then
  echo "== examples through ddprun, one worker per GPU"
  timeout 240 build-torch2/launcher/ddprun --standalone --nproc-per-node gpu build-torch2/examples/lenet_fmnist/lenet_fmnist \
    --data-dir "$kit/data" --epochs 2 --run-dir "$out/runs/lenet" || echo "gpu-kit: lenet_fmnist failed"
  timeout 240 build-torch2/launcher/ddprun --standalone --nproc-per-node gpu build-torch2/examples/resnet18_fmnist/resnet18_fmnist \
    --data-dir "$kit/data" --epochs 1 --global-batch-size 256 --limit-batches 100 --run-dir "$out/runs/resnet18" ||
    echo "gpu-kit: resnet18_fmnist failed"
  echo "== lenet_fmnist through a rendezvous on a c10d store (ddprun-store.so on this machine's LibTorch)"
  timeout 240 build-torch2/launcher/ddprun --nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29517 \
    --rdzv-id gpu-kit --nproc-per-node gpu build-torch2/examples/lenet_fmnist/lenet_fmnist --data-dir "$kit/data" \
    --epochs 1 --limit-batches 50 --run-dir "$out/runs/lenet_c10d" || echo "gpu-kit: lenet_fmnist on a c10d store failed"
  fi
  if [[ "${GPU_KIT_INPUT:-1}" == 1 ]]; then
    echo "== the examples' input path against fixed data (steady state)"
    "$py" bench/run_input_bench.py --build build-torch2 --data-dir "$kit/data" --rounds "${GPU_INPUT_ROUNDS:-2}" \
      ${GPU_INPUT_ARGS:-} | tee "$out/input_bench.txt" || echo "gpu-kit: input benchmark failed"
  fi
  if [[ "${GPU_KIT_AMP:-1}" == 1 ]]; then
    echo "== AMP against float32: ResNet-18, batch 256, 192 px, fixed data, both implementations"
    "$py" bench/run_gpu_bench.py --build build-torch2 --python "$py" --models resnet18 --modes ddp,pytorch_ddp \
      --amp none,fp16 --image 192 --iters "${GPU_AMP_ITERS:-40}" --rounds "${GPU_AMP_ROUNDS:-3}" \
      --out "$out/amp_bench.csv" || echo "gpu-kit: AMP benchmark failed"
  fi
  if [[ "${GPU_KIT_BENCH:-1}" == 1 ]]; then
    echo "== benchmark"
    "$py" bench/run_gpu_bench.py --build build-torch2 --python "$py" --rounds "${GPU_BENCH_ROUNDS:-3}" \
      --out "$out/gpu_bench.csv" ${GPU_BENCH_ARGS:-} || echo "gpu-kit: benchmark failed"
  fi
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: deploy/gpu-kit.sh pack|run" >&2; exit 2 ;;
esac
