// A process group that adds the bytes of every all-reduce to a counter and
// passes every collective on: what a communication hook (PowerSGD's own
// collectives included) really sends, for bench/lenet_bench.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/ddp.h"

namespace bench {

class ByteCountingGroup : public ddp::ProcessGroup {
 public:
  ByteCountingGroup(std::shared_ptr<ddp::ProcessGroup> inner, std::shared_ptr<int64_t> bytes)
      : inner_(std::move(inner)), bytes_(std::move(bytes)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  torch::Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  ddp::Work allreduce(at::Tensor& tensor) override {
    *bytes_ += tensor.numel() * tensor.element_size();
    return inner_->allreduce(tensor);
  }
  ddp::Work broadcast(at::Tensor& tensor, int root) override { return inner_->broadcast(tensor, root); }
  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override { return inner_->allgather(tensor); }
  void barrier() override { inner_->barrier(); }

 private:
  std::shared_ptr<ddp::ProcessGroup> inner_;
  std::shared_ptr<int64_t> bytes_;
};

}  // namespace bench
