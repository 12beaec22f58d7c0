// The test doubles of ddp::ProcessGroup, for tests, fuzz harnesses and
// benches alike:
//   FakeGroup      rank `rank` of `size` in one process, no peer behind it:
//                  collectives act as a group of one would (a rank's own
//                  tensor is the result), all-gathers add what the peers
//                  are scripted to report; or every collective refused, for
//                  code that must not communicate.
//   CountingGroup  a decorator that counts what it is asked for and passes
//                  every call on, subgroups included.
// Both implement every virtual of ProcessGroup.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::testing {

class FakeGroup final : public ProcessGroup {
 public:
  enum class Collectives { local, refused };

  explicit FakeGroup(int rank = 0, int size = 1, Collectives collectives = Collectives::local)
      : rank_(rank), size_(size), collectives_(collectives) {}
  // All-gathers return this rank's tensor, then these, in rank order (the
  // peers' reports; rank must be 0).
  FakeGroup& peers_report(std::vector<at::Tensor> tensors) {
    peers_ = std::move(tensors);
    return *this;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "fake"; }
  torch::Device device() const override { return torch::kCPU; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(1); }

  Work allreduce(at::Tensor&) override { return refuse_or_done("allreduce"); }
  Work broadcast(at::Tensor&, int) override { return refuse_or_done("broadcast"); }
  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override {
    refuse("allgather");
    if (static_cast<int>(peers_.size()) + 1 != size_ || (size_ > 1 && rank_ != 0))
      throw std::logic_error("FakeGroup: an all-gather of rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + " needs the other ranks' reports (peers_report), as rank 0");
    std::vector<at::Tensor> out{tensor.clone()};
    for (const auto& t : peers_) out.push_back(t.clone());
    return out;
  }
  void barrier() override { refuse("barrier"); }

  // As a group of one: each output is the rank's own input. A larger
  // group's collectives have no peers to come from: refused.
  Work collective(const CollectiveCall& call) override {
    refuse(collective_name(call.kind));
    if (size_ > 1) throw std::logic_error(std::string("FakeGroup: ") + collective_name(call.kind) +
                                          " of a group of " + std::to_string(size_) + ": only a group of one has them");
    using Kind = CollectiveCall::Kind;
    switch (call.kind) {
      case Kind::AllGather:
      case Kind::Gather:
        for (const auto& out : call.outputs) out.copy_(call.inputs[0]);
        break;
      case Kind::AllGatherIntoTensor:
      case Kind::ReduceScatter:
      case Kind::ReduceScatterTensor:
      case Kind::AllToAll:
      case Kind::AllToAllSingle:
      case Kind::Scatter:
        if (!call.outputs.empty() && !call.inputs.empty()) call.outputs[0].copy_(call.inputs[0]);
        break;
      default:  // in place, or nothing to move
        break;
    }
    return {};
  }
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks, std::chrono::milliseconds) override {
    for (size_t k = 0; k < ranks.size(); ++k)
      if (ranks[k] == rank_) return std::make_shared<FakeGroup>(static_cast<int>(k), ranks.size(), collectives_);
    return nullptr;
  }

 private:
  void refuse(const std::string& op) const {
    if (collectives_ == Collectives::refused) throw std::logic_error("a collective where none was expected: " + op);
  }
  Work refuse_or_done(const std::string& op) const {
    refuse(op);
    return {};
  }
  int rank_, size_;
  Collectives collectives_;
  std::vector<at::Tensor> peers_;
};

// What a CountingGroup and the subgroups it made were asked for.
struct CollectiveCounts {
  std::atomic<int64_t> allreduces{0}, broadcasts{0}, allgathers{0}, barriers{0}, collectives{0};
  std::atomic<int64_t> allreduced_bytes{0};  // by allreduce() and dist's all_reduce
};

class CountingGroup final : public ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<ProcessGroup> inner,
                         std::shared_ptr<CollectiveCounts> counts = std::make_shared<CollectiveCounts>())
      : inner_(std::move(inner)), counts_(std::move(counts)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  torch::Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  Work allreduce(at::Tensor& tensor) override {
    ++counts_->allreduces;
    counts_->allreduced_bytes += bytes(tensor);
    return inner_->allreduce(tensor);
  }
  Work broadcast(at::Tensor& tensor, int root) override {
    ++counts_->broadcasts;
    return inner_->broadcast(tensor, root);
  }
  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override {
    ++counts_->allgathers;
    return inner_->allgather(tensor);
  }
  void barrier() override {
    ++counts_->barriers;
    inner_->barrier();
  }
  std::shared_ptr<StoreHandle> store() const override { return inner_->store(); }
  Work collective(const CollectiveCall& call) override {
    ++counts_->collectives;
    if (call.kind == CollectiveCall::Kind::AllReduce) counts_->allreduced_bytes += bytes(call.inputs[0]);
    return inner_->collective(call);
  }
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks,
                                             std::chrono::milliseconds timeout) override {
    auto sub = inner_->new_subgroup(ranks, timeout);
    return sub ? std::make_shared<CountingGroup>(std::move(sub), counts_) : nullptr;
  }
  void shutdown() override { inner_->shutdown(); }

  const CollectiveCounts& counts() const { return *counts_; }

 private:
  static int64_t bytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }
  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<CollectiveCounts> counts_;
};

}  // namespace ddp::testing
