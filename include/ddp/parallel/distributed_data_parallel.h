// ddp::DistributedDataParallel: wraps a module so that backward averages
// gradients across ranks, with communication hidden behind backward.
//
//   auto pg = ddp::init_process_group();
//   auto net = std::make_shared<Net>();
//   ddp::DistributedDataParallel model(net, pg, ddp::DistributedDataParallelOptions().bucket_cap_mb(25));
//   auto loss = torch::nll_loss(model(x), y);
//   loss.backward();          // gradients are averaged when it returns
//   optimizer.step();
#pragma once

#include <torch/torch.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ddp/parallel/comm_hook.h"
#include "ddp/parallel/ddp_options.h"
#include "ddp/parallel/join.h"
#include "ddp/parallel/output_tensors.h"
#include "ddp/observe/logging_data.h"
#include "ddp/comm/process_group.h"
#include "ddp/parallel/reducer_stats.h"
#include "ddp/observe/timeline.h"

namespace ddp {

// What every DistributedDataParallel<M> has, whatever M: its options, its
// process group, the reducer's statistics and no_sync(). Code that handles
// wrapped models of different types can take a DistributedDataParallelBase&.
// A Joinable: ddp::join({&model}, loop) trains on uneven inputs (ddp/parallel/join.h).
class DistributedDataParallelBase : public Joinable {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                              DistributedDataParallelOptions options);
  virtual ~DistributedDataParallelBase();

  const DistributedDataParallelOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *pg_; }
  // PyTorch 2.x's bucket_bytes_cap_list: bucket_cap_mb_list in bytes, empty without one.
  std::vector<int64_t> bucket_bytes_cap_list() const {
    std::vector<int64_t> caps;
    for (double mb : options_.bucket_cap_mb_list()) caps.push_back(static_cast<int64_t>(mb * 1024 * 1024));
    return caps;
  }
  // What the reducer measured in the last synchronised step (ddp/parallel/reducer_stats.h).
  const ReducerStats& stats() const;
  // The job's timeline when DDP_TIMELINE is set (ddp/observe/timeline.h), else null.
  // The training kit records its optimizer steps on it.
  const std::shared_ptr<Timeline>& timeline() const { return timeline_; }
  // PyTorch's _get_ddp_logging_data(): the configuration, the buckets and
  // the runtime means of this rank (ddp/observe/logging_data.h).
  DDPLoggingData get_ddp_logging_data() const;

  // RAII: backward passes inside it accumulate gradients locally; the next
  // synchronised backward reduces the accumulated sum. As PyTorch's no_sync().
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelBase& ddp);
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) { other.ddp_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallelBase* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // As PyTorch's register_comm_hook(state, hook): every bucket is reduced by
  // hook(state, bucket), which returns a CommFuture of the reduced bucket
  // (ddp/parallel/comm_hook.h; built-in hooks in ddp/parallel/default_hooks.h).
  // The state is kept for the model's lifetime and passed by reference.
  // Once, before the first backward; else a UsageError.
  //   model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook);
  template <typename State, typename Hook>
  void register_comm_hook(State state, Hook hook) {
    auto shared = std::make_shared<State>(std::move(state));
    install_comm_hook(
        [shared, hook = std::move(hook)](GradBucket& bucket) -> CommFuture { return hook(*shared, bucket); });
  }

  // Joinable (ddp/parallel/join.h): the hook that shadows this model's collectives on
  // a rank that ran out of inputs, and syncs the final model from the last
  // rank to finish. As PyTorch's DistributedDataParallel.join_hook().
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() override { return *pg_; }

  // The reducer and the state of a step (src/parallel/ddp_internals.h).
  struct Internals;

 protected:
  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

 private:
  void install_comm_hook(CommHook hook);
  void start_timeline();
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<Timeline> timeline_;
  std::unique_ptr<Internals> internals_;
  friend inline Internals& internals_of(DistributedDataParallelBase& ddp);
};

// Checks that every rank holds the same parameters and buffers (count,
// names, shapes, strides, dtypes, which parameters require grad), but those
// named in `ignore`; throws on every rank, naming the first difference.
void verify_same_model(const torch::nn::Module& module, ProcessGroup& pg, const std::vector<std::string>& ignore = {});

// Every rank takes rank 0's values of these tensors (coalesced by dtype).
void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root = 0);

template <typename M>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(std::shared_ptr<M> module, std::shared_ptr<ProcessGroup> pg, DistributedDataParallelOptions options = {})
      : DistributedDataParallelBase(module, std::move(pg), options), module_(std::move(module)) {}
  explicit DistributedDataParallel(std::shared_ptr<M> module)
      : DistributedDataParallel(std::move(module), default_process_group()) {}
  // Module holders (torch::nn::Sequential, TORCH_MODULE types).
  template <typename C, typename = std::enable_if_t<std::is_same_v<C, M>>>
  DistributedDataParallel(const torch::nn::ModuleHolder<C>& holder, std::shared_ptr<ProcessGroup> pg,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(pg), options) {}

  // model(args...) runs M::forward(args...) with DDP's bookkeeping around it.
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    pre_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    post_forward(output_tensors(output));  // ddp/parallel/output_tensors.h
    return output;
  }
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    return (*this)(std::forward<Args>(args)...);
  }

  const std::shared_ptr<M>& module() const { return module_; }
  M* operator->() const { return module_.get(); }

 private:
  std::shared_ptr<M> module_;
};

template <typename M>
DistributedDataParallel(std::shared_ptr<M>, std::shared_ptr<ProcessGroup>) -> DistributedDataParallel<M>;
template <typename M>
DistributedDataParallel(std::shared_ptr<M>, std::shared_ptr<ProcessGroup>, DistributedDataParallelOptions) -> DistributedDataParallel<M>;
template <typename C>
DistributedDataParallel(torch::nn::ModuleHolder<C>, std::shared_ptr<ProcessGroup>) -> DistributedDataParallel<C>;
template <typename C>
DistributedDataParallel(torch::nn::ModuleHolder<C>, std::shared_ptr<ProcessGroup>, DistributedDataParallelOptions)
    -> DistributedDataParallel<C>;

}  // namespace ddp
