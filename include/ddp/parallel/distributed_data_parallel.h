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
#include "ddp/observe/logging_data.h"
#include "ddp/comm/process_group.h"
#include "ddp/parallel/reducer.h"
#include "ddp/observe/timeline.h"

namespace ddp {

namespace detail {

// The tensors in a forward's result, to find parameters it did not use.
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) {
  if (t.defined()) out.push_back(t);
}
inline void collect_tensors(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
  for (const auto& t : v) collect_tensors(t, out);
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& tup, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect_tensors(e, out), ...); }, tup);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
// Anything else carries no tensors we can see: unused parameters are then
// found at the end of backward instead.
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

}  // namespace detail

// What every DistributedDataParallel<M> has, whatever M: its options, its
// process group, the reducer's statistics and no_sync(). Code that handles
// wrapped models of different types can take a DistributedDataParallelBase&.
// A Joinable: ddp::join({&model}, loop) trains on uneven inputs (ddp/parallel/join.h).
class DistributedDataParallelBase : public Joinable {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg, DistributedDataParallelOptions options);
  virtual ~DistributedDataParallelBase();

  const DistributedDataParallelOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *pg_; }
  const ReducerStats& stats() const { return reducer_->stats(); }
  Reducer& reducer() { return *reducer_; }
  // The job's timeline when DDP_TIMELINE is set (ddp/observe/timeline.h), else null.
  // The training kit records its optimizer steps on it.
  const std::shared_ptr<Timeline>& timeline() const { return timeline_; }
  // PyTorch's _get_ddp_logging_data(): the configuration, the buckets and
  // the runtime means of this rank (ddp/logging_data.h).
  DDPLoggingData get_ddp_logging_data() const;

  // RAII: backward passes inside it accumulate gradients locally; the next
  // synchronised backward reduces the accumulated sum. As PyTorch's no_sync().
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelBase& ddp) : ddp_(&ddp), previous_(ddp.reducer_->sync()) { ddp.reducer_->set_sync(false); }
    ~NoSyncGuard() {
      if (ddp_) ddp_->reducer_->set_sync(previous_);
    }
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
  // (ddp/comm_hook.h; built-in hooks in ddp/default_hooks.h). The state is
  // kept for the model's lifetime and passed by reference. Once, before the
  // first backward; else a UsageError.
  //   model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook);
  template <typename State, typename Hook>
  void register_comm_hook(State state, Hook hook) {
    auto shared = std::make_shared<State>(std::move(state));
    reducer_->register_comm_hook(
        [shared, hook = std::move(hook)](GradBucket& bucket) -> CommFuture { return hook(*shared, bucket); });
  }

  // Joinable (ddp/parallel/join.h): the hook that shadows this model's collectives on
  // a rank that ran out of inputs, and syncs the final model from the last
  // rank to finish. As PyTorch's DistributedDataParallel.join_hook().
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() override { return *pg_; }

 protected:
  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> state_;  // parameters, then buffers: what the final Join sync broadcasts
  std::unique_ptr<Reducer> reducer_;
  std::shared_ptr<Timeline> timeline_;
  int64_t forward_start_us_ = 0;
  DDPLoggingData logging_data_;  // what construction knows
  bool joined_up_ = false;       // join_hook() was asked for
  void record_construction_logging_data(const std::vector<at::Tensor>& params);
  // ddp::Join: this model's hook, and the forward's all-reduce telling joined
  // ranks whether the backward synchronises.
  friend class DDPJoinHook;
  bool divide_by_initial_world_size_ = true;
  Work join_sync_work_;
  int find_common_rank(bool candidate);
  void join_main_hook();
  void join_post_hook(bool is_last_joiner);
  bool require_forward_param_sync_ = true;  // the last forward that built a graph synchronised
  // Bytes malloc had handed out before the first forward that builds a graph,
  // and whether that forward is still to tell retain_step_memory() its size.
  std::size_t bytes_before_first_forward_ = 0;
  bool step_memory_pending_ = false;
};


// Checks that every rank holds the same parameters and buffers (count,
// names, shapes, strides, dtypes, which parameters require grad); throws on
// every rank, naming the first difference.
void verify_same_model(const torch::nn::Module& module, ProcessGroup& pg);

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
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    post_forward(tensors);
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
