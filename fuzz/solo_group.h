// A one-rank process group without communication, for the checkpoint
// harness and the seed writer: collectives return at once, allgather returns
// its input.
#pragma once

#include "ddp/comm/process_group.h"

namespace ddp::fuzz {

class SoloGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "solo"; }
  torch::Device device() const override { return torch::kCPU; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(1); }
  Work allreduce(at::Tensor&) override { return {}; }
  Work broadcast(at::Tensor&, int) override { return {}; }
  std::vector<at::Tensor> allgather(const at::Tensor& t) override { return {t.clone()}; }
  void barrier() override {}
};

}  // namespace ddp::fuzz
