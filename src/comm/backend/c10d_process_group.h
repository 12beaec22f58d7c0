// The gloo and nccl backends: ddp::ProcessGroup over a c10d backend
// (ProcessGroupGloo / ProcessGroupNCCL), the collectives of ddp::dist mapped
// one to one onto c10d's, and new_group's subgroups made the way PyTorch
// makes them (a backend of the same kind on a prefix of the same store).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "comm/c10d_compat.h"
#include "comm/work_handle.h"

namespace ddp::detail {

#ifdef USE_C10D_GLOO
using GlooDevices = std::vector<std::shared_ptr<::gloo::transport::Device>>;
#else
using GlooDevices = std::vector<std::shared_ptr<void>>;
#endif

class C10dProcessGroup final : public ProcessGroup {
 public:
  // `prefix`: the store prefix the backend uses, unique in the job; a
  // subgroup's extends it. `gloo_devices`: the Gloo transport devices the
  // backend was made with (reused by subgroups), empty for NCCL.
  C10dProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<compat::Backend> backend,
                   std::string name, torch::Device device, std::chrono::milliseconds timeout, std::string prefix,
                   GlooDevices gloo_devices = {});

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return name_; }
  torch::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Work allreduce(at::Tensor& tensor) override;
  Work broadcast(at::Tensor& tensor, int root) override;
  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override;
  void barrier() override;
  std::shared_ptr<StoreHandle> store() const override { return std::make_shared<StoreHandle>(store_); }

  Work collective(const CollectiveCall& call) override;
  std::vector<Work> coalesced(const std::vector<CollectiveCall>& calls) override;
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks,
                                             std::chrono::milliseconds timeout) override;
  // Shuts the backend down (2.x: c10d's Backend::shutdown, the normal exit
  // NCCL expects) and lets it go, with every subgroup this group made.
  void shutdown() override;
  // c10d's Backend::abort() (NCCL's communicators; Gloo's is a no-op).
  void abort() override;

 private:
  // The backend, or a UsageError where shutdown() has let it go.
  compat::Backend& live(const char* op) const;
  Work wrap(c10::intrusive_ptr<c10d::Work> work, const char* op);
  c10::intrusive_ptr<c10d::Work> start(const CollectiveCall& call);
  c10::intrusive_ptr<c10d::Work> started(const CollectiveCall& call, const std::string& who);
  void refuse_unsupported(const CollectiveCall& call, const std::string& who) const;
  Work monitored_barrier(const CollectiveCall& call, const std::string& who);

  c10::intrusive_ptr<c10d::Store> store_;  // the backend keeps using it after construction
  c10::intrusive_ptr<compat::Backend> backend_;  // null once shut down
  int rank_, size_;
  std::string name_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  GlooDevices gloo_devices_;
  int subgroups_ = 0;                               // new_subgroup calls so far (same on every rank)
  std::vector<std::weak_ptr<ProcessGroup>> made_;   // the subgroups this rank is in, shut down with it
};

}  // namespace ddp::detail
