// A ProcessGroup decorator that counts what the reducer asked for.
#pragma once

#include <atomic>

#include "ddp/comm/process_group.h"

namespace ddp::testing {

class CountingProcessGroup : public ProcessGroup {
 public:
  explicit CountingProcessGroup(std::shared_ptr<ProcessGroup> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  torch::Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  Work allreduce(at::Tensor& t) override {
    ++allreduces;
    allreduced_bytes += t.numel() * t.element_size();
    return inner_->allreduce(t);
  }
  Work broadcast(at::Tensor& t, int root) override {
    ++broadcasts;
    return inner_->broadcast(t, root);
  }
  std::vector<at::Tensor> allgather(const at::Tensor& t) override {
    ++allgathers;
    return inner_->allgather(t);
  }
  void barrier() override { inner_->barrier(); }
  c10::intrusive_ptr<c10d::Store> store() const override { return inner_->store(); }

  std::atomic<int64_t> allreduces{0}, broadcasts{0}, allgathers{0}, allreduced_bytes{0};

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace ddp::testing
