// One rank of a GPU test (gpu_test.cpp starts it with torchrun's variables).
// Each scenario runs CUDA tensors through one part of libddp and checks what
// it can check itself; the parity scenarios write their results as raw
// float32 for gpu_test.cpp to compare with pytorch_gpu_oracle.py's. Exits 0
// on success, 1 with the failed check, 3 when this build or machine has no GPU.
#include <torch/torch.h>

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../support/worker_common.h"  // EXPECT_OR_FAIL
#include "ddp/comm/recovery.h"

namespace {

using ddp::testing::Fail;
using Flags = std::map<std::string, std::string>;

std::string flag(const Flags& f, const std::string& k, const std::string& fallback) {
  auto it = f.find(k);
  return it == f.end() ? fallback : it->second;
}

// The data and initial values of gpu_common.py: sin of an arithmetic
// sequence, computed in float64 on the CPU and rounded to float32 once, so
// that both programs start from the same bytes.
torch::Tensor wave(std::vector<int64_t> shape, double step, double phase, double amplitude = 1.0) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto k = torch::arange(n, torch::kDouble);
  return (torch::sin(k * step + phase) * amplitude).to(torch::kFloat).reshape(shape);
}

// Parameter i (named_parameters() order): 0.1 sin(0.7 k + i).
void init_parameters(torch::nn::Module& m, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : m.named_parameters()) {
    p.value().copy_(wave(p.value().sizes().vec(), 0.7, i, 0.1).to(device));
    ++i;
  }
}

// Parameters, then floating-point buffers, as raw float32, to `path`.
void write_state(torch::nn::Module& m, const std::string& path, const std::vector<torch::Tensor>& extra = {}) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](const torch::Tensor& t) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * 4));
  };
  for (auto& p : m.parameters()) put(p);
  for (auto& b : m.buffers())
    if (b.is_floating_point()) put(b);
  for (auto& t : extra) put(t);
}

std::string out_dir() {
  const char* d = std::getenv("DDP_TEST_DIR");
  return d ? d : "/tmp";
}

#ifdef DDP_WITH_CUDA

torch::Device cuda_device(const ddp::ProcessGroup& pg) {
  if (pg.device().is_cuda()) return pg.device();
  // Gloo: every rank on the GPU its local rank picks (they may share one).
  const int local = std::atoi(std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local % torch::cuda::device_count()));
}

// All-reduce, broadcast, all-gather and barrier of CUDA tensors; a 64 MiB
// all-reduce; the group's device is this rank's GPU.
int nccl_collectives(ddp::ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.size();
  EXPECT_OR_FAIL(pg.backend_name() == "nccl", "backend " + pg.backend_name());
  EXPECT_OR_FAIL(pg.device().is_cuda(), "the nccl group's device is " + pg.device().str());
  EXPECT_OR_FAIL(pg.device().index() == rank % torch::cuda::device_count(), "device " + pg.device().str());
  const auto opts = torch::TensorOptions().device(pg.device());
  auto t = torch::full({1000}, static_cast<float>(rank + 1), opts);
  pg.allreduce(t).wait();
  EXPECT_OR_FAIL(torch::all(t == static_cast<float>(world * (world + 1) / 2)).item<bool>(), "allreduce sum");
  auto b = torch::full({7}, static_cast<double>(rank == 0 ? 42 : -1), opts.dtype(torch::kDouble));
  pg.broadcast(b, 0).wait();
  EXPECT_OR_FAIL(torch::all(b == 42).item<bool>(), "broadcast from rank 0");
  auto g = pg.allgather(torch::full({3}, static_cast<int64_t>(rank), opts.dtype(torch::kLong)));
  EXPECT_OR_FAIL(static_cast<int>(g.size()) == world, "allgather size");
  for (int r = 0; r < world; ++r) {
    EXPECT_OR_FAIL(g[r].is_cuda(), "allgather result on " + g[r].device().str());
    EXPECT_OR_FAIL(torch::all(g[r] == r).item<bool>(), "allgather rank " + std::to_string(r));
  }
  pg.barrier();
  auto big = torch::ones({16 * 1024 * 1024}, opts);  // 64 MiB
  pg.allreduce(big).wait();
  EXPECT_OR_FAIL(torch::all(big == static_cast<float>(world)).item<bool>(), "64 MiB allreduce");
  std::cout << "rank " << rank << ": nccl collectives on " << pg.device() << " ok" << std::endl;
  return 0;
}

// A conv net with several buckets' worth of tensors.
torch::nn::Sequential conv_net() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)), nn::Functional(torch::relu),
                        nn::Conv2d(nn::Conv2dOptions(16, 16, 3).padding(1)), nn::Functional(torch::relu),
                        nn::Flatten(), nn::Linear(16 * 8 * 8, 64), nn::Functional(torch::relu), nn::Linear(64, 10));
}

// DDP's gradients of CUDA parameters equal the ranks' local gradients
// averaged, bit for bit (1 or 2 ranks: (g0 + g1) / 2 is exact in any order),
// over nccl or over Gloo (CUDA tensors through Gloo), with tiny buckets;
// with --side-stream 1 everything runs on a stream of the user's (DDP must
// order its copies and collectives after the backward kernels on it), with
// --pinned 1 the batches come from pinned host memory, copied non-blocking.
int reducer_gradients(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr, const Flags& flags) {
  const int rank = pg.rank(), world = pg.size();
  EXPECT_OR_FAIL(world <= 2, "this scenario's exact average needs 1 or 2 ranks");
  const torch::Device device = cuda_device(pg);
  c10::cuda::CUDAGuard guard(device);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  const bool side_stream = flag(flags, "--side-stream", "0") == "1";
  const bool pinned = flag(flags, "--pinned", "0") == "1";
  const bool as_view = flag(flags, "--as-view", "1") == "1";
  auto stream = side_stream ? c10::cuda::getStreamFromPool(false, device.index()) : c10::cuda::getCurrentCUDAStream();
  c10::cuda::CUDAStreamGuard stream_guard(stream);

  auto net = conv_net(), ref = conv_net();
  net->to(device);
  ref->to(device);
  init_parameters(*net, device);
  init_parameters(*ref, device);
  ddp::DistributedDataParallel model(
      net, pg_ptr, ddp::DDPOptions().first_bucket_mb(0.01).bucket_cap_mb(0.05).gradient_as_bucket_view(as_view));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05));
  const int64_t per_rank = 4;
  for (int step = 0; step < 6; ++step) {
    auto x_host = wave({per_rank * world, 3, 8, 8}, 0.37, 1.3 * step).narrow(0, rank * per_rank, per_rank).contiguous();
    auto y_host = wave({per_rank * world, 10}, 0.11, step).narrow(0, rank * per_rank, per_rank).contiguous();
    if (pinned) {
      x_host = x_host.pin_memory();
      y_host = y_host.pin_memory();
      EXPECT_OR_FAIL(x_host.is_pinned(), "pin_memory()");
    }
    auto x = x_host.to(device, /*non_blocking=*/pinned), y = y_host.to(device, /*non_blocking=*/pinned);
    opt.zero_grad(false);
    ref_opt.zero_grad(false);
    torch::mse_loss(ref->forward(x), y).backward();
    torch::mse_loss(model(x), y).backward();
    // The average of the ranks' local gradients, formed on the CPU.
    auto ref_params = ref->parameters(), params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto mine = ref_params[i].grad().detach().clone();
      auto all = pg.allgather(mine);
      auto sum = all[0].to(torch::kCPU);
      for (int r = 1; r < world; ++r) sum = sum + all[r].to(torch::kCPU);
      auto expected = sum / world;
      auto got = params[i].grad().to(torch::kCPU);
      EXPECT_OR_FAIL(params[i].grad().is_cuda(), "the gradient left the GPU");
      EXPECT_OR_FAIL(torch::equal(got, expected),
                    "step " + std::to_string(step) + " parameter " + std::to_string(i) + ": max diff " +
                        std::to_string((got - expected).abs().max().item<double>()));
    }
    opt.step();
    // The reference takes the averaged step too, so both stay equal.
    for (size_t i = 0; i < params.size(); ++i) ref_params[i].mutable_grad().copy_(params[i].grad());
    ref_opt.step();
  }
  auto flat = torch::cat([&] {
    std::vector<torch::Tensor> v;
    for (auto& p : net->parameters()) v.push_back(p.detach().flatten());
    return v;
  }());
  auto all = pg.allgather(flat);
  for (int r = 0; r < world; ++r) EXPECT_OR_FAIL(torch::equal(all[r], all[0]), "parameters differ across ranks");
  std::cout << "rank " << rank << ": " << model.stats().num_buckets << " buckets on " << device
            << (side_stream ? ", side stream" : "") << (pinned ? ", pinned copies" : "") << ": gradients bitwise"
            << std::endl;
  return 0;
}

// SyncBatchNorm in a conv net under DDP, 3 steps of SGD; writes parameters,
// running statistics and the last step's output (gpu_common.py's model).
int syncbn_parity(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr) {
  namespace nn = torch::nn;
  const int rank = pg.rank(), world = pg.size();
  const torch::Device device = cuda_device(pg);
  c10::cuda::CUDAGuard guard(device);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 6, 3).padding(1)), ddp::SyncBatchNorm(6, pg_ptr),
                     nn::Functional(torch::relu), nn::Flatten(), nn::Linear(6 * 8 * 8, 4));
  net->to(device);
  init_parameters(*net, device);
  ddp::DistributedDataParallel model(net, pg_ptr);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  const int64_t per_rank = 4;
  torch::Tensor out;
  for (int step = 0; step < 3; ++step) {
    auto x = wave({per_rank * world, 3, 8, 8}, 0.37, 1.3 * step, 2.0).narrow(0, rank * per_rank, per_rank).to(device);
    auto y = wave({per_rank * world, 4}, 0.11, step).narrow(0, rank * per_rank, per_rank).to(device);
    opt.zero_grad(false);
    out = model(x);
    torch::mse_loss(out, y).backward();
    opt.step();
  }
  write_state(*net, out_dir() + "/cpp_syncbn_rank" + std::to_string(rank) + ".bin", {out});
  std::cout << "rank " << rank << ": syncbn written" << std::endl;
  return 0;
}

// float16 autocast and the GradScaler's CUDA kernels, 10 steps of SGD under
// DDP, with overflowing inputs at steps 3 and 4; writes the parameters and,
// per step, "<step> <scale> <stepped>".
int amp_parity(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr) {
  namespace nn = torch::nn;
  const int rank = pg.rank(), world = pg.size();
  const torch::Device device = cuda_device(pg);
  c10::cuda::CUDAGuard guard(device);
  nn::Sequential net(nn::Linear(16, 32), nn::Functional(torch::relu), nn::Linear(32, 8));
  net->to(device);
  init_parameters(*net, device);
  ddp::DistributedDataParallel model(net, pg_ptr);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  ddp::GradScaler scaler(pg_ptr, ddp::GradScalerOptions().init_scale(65536.0).growth_interval(3));
  std::ofstream scales(out_dir() + "/cpp_amp_rank" + std::to_string(rank) + "_scales.txt");
  const int64_t per_rank = 8;
  for (int step = 0; step < 10; ++step) {
    const double amplitude = (step == 3 || step == 4) ? 1e5 : 2.0;
    auto x = wave({per_rank * world, 16}, 0.37, 1.3 * step, amplitude).narrow(0, rank * per_rank, per_rank).to(device);
    auto y = wave({per_rank * world, 8}, 0.11, step).narrow(0, rank * per_rank, per_rank).to(device);
    opt.zero_grad(false);
    torch::Tensor loss;
    {
      ddp::Autocast autocast(torch::kCUDA, torch::kHalf);
      auto out = model(x);
      EXPECT_OR_FAIL(out.scalar_type() == torch::kHalf, "autocast: the output is not float16");
      loss = torch::mse_loss(out, y);
    }
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    scales << step << " " << std::setprecision(17) << scaler.get_scale() << " " << (stepped ? 1 : 0) << "\n";
  }
  write_state(*net, out_dir() + "/cpp_amp_rank" + std::to_string(rank) + ".bin");
  std::cout << "rank " << rank << ": amp written" << std::endl;
  return 0;
}

// Under ddprun --recover-in-process: an NCCL recoverable group on this
// rank's GPU, three DDP steps, then the group re-formed as after a fault
// (reform(): its NCCL communicators aborted, a new generation's made), three
// more. The parameters are bitwise those of the same six steps without DDP
// on the same GPU (a group of one: its average is the gradient itself).
int recovery_nccl() {
  ddp::RecoveryOptions options;
  options.backend = "nccl";
  options.deadline = std::chrono::seconds(30);
  auto group = ddp::init_recoverable_group(options);
  const torch::Device device = group->device();
  EXPECT_OR_FAIL(group->backend_name() == "nccl" && device.is_cuda(), "an nccl group on this rank's GPU");
  auto make = [&] {
    torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
    init_parameters(*net, device);
    net->to(device);
    return net;
  };
  auto net = make(), ref = make();
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD opt(net->parameters(), 0.1), ref_opt(ref->parameters(), 0.1);
  for (int step = 0; step < 6;) {
    const auto x = wave({12, 8}, 0.3, step).to(device), y = wave({12, 4}, 0.5, step).to(device);
    if (step == 3 && group->generation() == 0) {
      group->reform();  // as a failed step would
      continue;
    }
    const bool committed = group->run_step([&] {
      opt.zero_grad();
      torch::mse_loss(model(x), y).backward();
    });
    EXPECT_OR_FAIL(committed, "step " + std::to_string(step) + " committed");
    opt.step();
    ref_opt.zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt.step();
    ++step;
  }
  EXPECT_OR_FAIL(group->generation() == 1, "one re-forming");
  for (size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_OR_FAIL(torch::equal(net->parameters()[i], ref->parameters()[i]), "parameter " + std::to_string(i));
  std::cout << "recovery_nccl: six steps over two generations, bitwise the plain steps" << std::endl;
  return 0;
}

#endif  // DDP_WITH_CUDA

}  // namespace

#ifdef DDP_WITH_CUDA
namespace ddp_gpu {
int checkpoint_async(ddp::ProcessGroup& pg, const torch::Device& device, const std::string& dir);  // gpu_checkpoint.cpp
}
#endif

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddp_gpu_worker SCENARIO [--flag value]...\n";
    return 2;
  }
  const std::string scenario = argv[1];
  Flags flags;
  for (int i = 2; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
#ifndef DDP_WITH_CUDA
  std::cerr << "ddp_gpu_worker: this build's LibTorch has no CUDA\n";
  return 3;
#else
  if (!torch::cuda::is_available()) {
    std::cerr << "ddp_gpu_worker: no GPU is visible\n";
    return 3;
  }
  try {
    if (scenario == "recovery_nccl") return recovery_nccl();
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend(flag(flags, "--backend", "nccl")));
    int rc = 2;
    if (scenario == "nccl_collectives") rc = nccl_collectives(*pg);
    else if (scenario == "reducer_gradients") rc = reducer_gradients(*pg, pg, flags);
    else if (scenario == "syncbn_parity") rc = syncbn_parity(*pg, pg);
    else if (scenario == "amp_parity") rc = amp_parity(*pg, pg);
    else if (scenario == "checkpoint_async")
      rc = ddp_gpu::checkpoint_async(*pg, cuda_device(*pg), flag(flags, "--dir", "."));
    else std::cerr << "ddp_gpu_worker: unknown scenario " << scenario << "\n";
    torch::cuda::synchronize();
    pg->barrier();
    ddp::destroy_process_group();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "rank " << std::getenv("RANK") << ": " << e.what() << std::endl;
    return 1;
  }
#endif
}
