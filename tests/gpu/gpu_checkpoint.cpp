// The background checkpoint writer with CUDA tensors (ddp_gpu_worker's
// "checkpoint_async"): the state is copied to page-locked host buffers on a
// side stream while training goes on, so a save must hold the values of the
// moment it was called, not those of the steps taken while it was written.
#include <torch/torch.h>

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "../support/worker_common.h"  // EXPECT_OR_FAIL
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"

#ifdef DDP_WITH_CUDA

namespace ddp_gpu {

namespace {

using ddp::testing::Fail;

torch::nn::Sequential small_net() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Linear(256, 512), nn::Functional(torch::relu), nn::Linear(512, 512),
                        nn::Functional(torch::relu), nn::Linear(512, 16));
}

// Parameters, then each one's Adam moments, on the host.
std::vector<torch::Tensor> snapshot(torch::nn::Module& net, torch::optim::Adam& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().cpu().clone());
  for (const auto& p : net.parameters()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    out.push_back(s.exp_avg().cpu().clone());
    out.push_back(s.exp_avg_sq().cpu().clone());
  }
  return out;
}

void step(torch::nn::Module& net, torch::optim::Adam& opt, const torch::Tensor& x, const torch::Tensor& y) {
  opt.zero_grad();
  auto out = net.as<torch::nn::Sequential>()->forward(x);
  torch::mse_loss(out, y).backward();
  opt.step();
}

}  // namespace

// Every rank trains the same net on the same batches (identical replicas, as
// under DDP). For each layout: two steps, a snapshot, save(), then at once
// four more steps whose kernels change every tensor being copied (a large
// matrix product queued first keeps the copies waiting behind it), wait(),
// and a fresh net and optimizer loaded from the checkpoint equal the
// snapshot bit for bit and differ from the trained-on net.
int checkpoint_async(ddp::ProcessGroup& pg, const torch::Device& device, const std::string& dir) {
  c10::cuda::CUDAGuard guard(device);
  for (const auto layout : {ddp::CheckpointLayout::single_file, ddp::CheckpointLayout::sharded}) {
    const bool sharded = layout == ddp::CheckpointLayout::sharded;
    const std::string path = dir + (sharded ? "/sharded" : "/checkpoint.pt");
    torch::manual_seed(3);
    auto net = small_net();
    net->to(device);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    const auto x = torch::randn({64, 256}).to(device), y = torch::randn({64, 16}).to(device);
    step(*net, opt, x, y);
    step(*net, opt, x, y);
    const auto expected = snapshot(*net, opt);
    ddp::TrainState state;
    state.step = 2;
    ddp::CheckpointWriter writer(pg, layout);
    auto busy = torch::randn({4096, 4096}, torch::TensorOptions().device(device));
    busy = busy.mm(busy);  // queued ahead of the copies
    writer.save(path, *net, opt, state);
    for (int i = 0; i < 4; ++i) step(*net, opt, x, y);
    writer.wait();
    const auto trained_on = snapshot(*net, opt);

    torch::manual_seed(4);
    auto fresh = small_net();
    fresh->to(device);
    torch::optim::Adam fresh_opt(fresh->parameters(), torch::optim::AdamOptions(1e-2));
    const auto loaded_state = ddp::load_checkpoint(path, *fresh, &fresh_opt, pg);
    EXPECT_OR_FAIL(loaded_state.step == 2, "the position saved");
    for (const auto& p : fresh->parameters()) EXPECT_OR_FAIL(p.is_cuda(), "parameters loaded onto the GPU");
    const auto loaded = snapshot(*fresh, fresh_opt);
    EXPECT_OR_FAIL(loaded.size() == expected.size(), "as many tensors");
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_OR_FAIL(torch::equal(loaded[i], expected[i]),
                     std::string(sharded ? "sharded" : "one file") + ": tensor " + std::to_string(i) +
                         " is the value at save()");
    }
    EXPECT_OR_FAIL(!torch::equal(trained_on[0], expected[0]), "training went on during the write");
  }
  std::cout << "rank " << pg.rank() << ": background checkpoints of CUDA tensors, one file and sharded, hold the "
            << "values at save()" << std::endl;
  return 0;
}

}  // namespace ddp_gpu

#endif  // DDP_WITH_CUDA
