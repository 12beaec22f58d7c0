// What a fixed malloc threshold costs a tensor above it: every such block is
// a fresh mmap(), page-faulted on first touch. One core, one process:
//   ddp_bench_malloc [MiB]   (no argument or 0: glibc's default, dynamic threshold)
// prints ms per `relu` then `* 2` on a 128x64x28x28 float tensor (25.7 MB,
// a ResNet-18 first-stage activation at 28x28), the same as
// ddp::fix_malloc_thresholds(MiB) leaves it. docs/performance.md quotes it.
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "ddp/runtime/malloc_tuning.h"
#include <torch/torch.h>

int main(int argc, char** argv) {
  const double mb = argc > 1 ? std::atof(argv[1]) : 0.0;
  const auto tuning = ddp::fix_malloc_thresholds(mb);
  torch::set_num_threads(1);
  const auto a = torch::randn({128, 64, 28, 28});
  double sink = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kIters = 100;
    for (int i = 0; i < kIters; ++i) sink += (torch::relu(a) * 2.0).index({0, 0, 0, 0}).item<double>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kIters;
    std::cout << "malloc: " << (tuning.applied ? tuning.reason : "glibc's default (" + tuning.reason + ")")
              << "; relu * 2 on 25.7 MB: " << ms << " ms" << std::endl;
  }
  return sink == 12345.678 ? 1 : 0;  // keeps the loop's results alive
}
