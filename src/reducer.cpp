#include "ddp/reducer.h"

#include "usage_check.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/grad_layout_contract.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_set>

namespace ddp {

using Clock = std::chrono::steady_clock;

struct Reducer::Impl : std::enable_shared_from_this<Impl> {
  struct Slot {
    size_t bucket = 0;
    size_t index = 0;  // within the bucket
  };
  struct Bucket {
    at::Tensor contents;            // flat, one dtype
    std::vector<size_t> vars;       // parameter indices
    std::vector<at::Tensor> views;  // aliases of contents laid out like each parameter
    size_t pending = 0;             // gradients not yet ready this iteration
    Work work;
    CommFuture future;  // with a comm hook, instead of work
  };

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps our hooks alive across iterations
  at::Tensor inverse_world;  // 1/W as a wrapped scalar, as PyTorch's mul_out takes it
  CommHook comm_hook;        // empty: the built-in all-reduce

  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  size_t next_bucket = 0;  // buckets launch strictly in order, the same on every rank

  std::vector<char> marked;        // ready this backward
  std::vector<char> locally_used;  // got a gradient since the last synchronised backward, no_sync ones included
  std::vector<size_t> unused_from_graph;
  bool unused_marked = false;  // unused_from_graph marked ready in this backward
  at::Tensor used_map;         // find_unused_parameters: locally_used, all-reduced
  Work used_work;

  bool sync = true;
  bool expect_hooks = false;  // a DDP forward prepared this backward
  uint64_t generation = 0;    // counts prepared backwards
  // Graph tasks (identified by their exec_info) whose end we asked to hear
  // about, and whether each is the backward through this forward's output
  // (a reentrant backward inside it, as activation checkpointing runs, is not).
  std::map<const void*, bool> armed_tasks;
  std::unordered_set<const torch::autograd::Node*> output_fns;

  bool rebuilt = false;          // buckets follow a recorded ready order
  bool rebuild_pending = false;  // the first synchronised backward finished: rebuild before the next forward
  std::vector<size_t> ready_order;
  Clock::time_point first_ready;
  bool timing = false;

  ReducerStats stats;
  mutable std::mutex mutex;

  // ddp::Join: the divisor of this backward's gradients, read from the
  // forward's count of ranks still training (0: not read yet).
  CommFuture nonjoined;
  bool divide_by_nonjoined = false;
  int64_t div_factor = 0;

  std::string who() const { return "rank " + std::to_string(pg->rank()) + ": DistributedDataParallel: "; }
  bool should_rebuild() const { return !rebuilt && !options.find_unused_parameters(); }

  void register_hooks() {
    std::weak_ptr<Impl> weak = shared_from_this();
    for (size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i]);
      check_usage(acc != nullptr, who(), "parameter '", names[i], "' is not a leaf that requires grad");
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto self = weak.lock()) self->autograd_hook(i);
            return outputs;
          }));
      accumulators.push_back(std::move(acc));
    }
  }

  // A tensor that aliases `contents` without being an autograd view: LibTorch's
  // Optimizer::zero_grad() calls detach_() on every grad, which views reject.
  // Laid out as the parameter when that is dense (channels_last stays
  // channels_last, so AccumulateGrad's gradient copies in without a
  // transpose), else row-major, as PyTorch's bucket views.
  static at::Tensor alias(const at::Tensor& contents, int64_t offset, const at::Tensor& like) {
    std::vector<int64_t> strides;
    if (like.is_non_overlapping_and_dense()) {
      strides.assign(like.strides().begin(), like.strides().end());
    } else {
      strides.assign(like.dim(), 1);
      for (int64_t d = like.dim() - 2; d >= 0; --d)
        strides[d] = strides[d + 1] * std::max<int64_t>(like.size(d + 1), 1);
    }
    return at::empty({0}, contents.options())
        .set_(contents.storage(), contents.storage_offset() + offset, like.sizes(), strides);
  }

  static bool is_alias(const at::Tensor& grad, const at::Tensor& view) {
    return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
           grad.strides() == view.strides();
  }

  void initialize_buckets(const std::vector<std::vector<size_t>>& assignment) {
    torch::NoGradGuard no_grad;
    buckets.clear();
    slots.assign(params.size(), {});
    for (const auto& vars : assignment) {
      Bucket b;
      b.vars = vars;
      int64_t total = 0;
      for (size_t i : vars) total += params[i].numel();
      b.contents = at::zeros({total}, params[vars.front()].options().requires_grad(false));
      int64_t offset = 0;
      for (size_t k = 0; k < vars.size(); ++k) {
        const auto& p = params[vars[k]];
        b.views.push_back(alias(b.contents, offset, p));
        slots[vars[k]] = {buckets.size(), k};
        offset += p.numel();
        // Gradients that live in the old buckets (a rebuild during gradient
        // accumulation) move into the new ones.
        auto& grad = p.mutable_grad();
        if (options.gradient_as_bucket_view() && grad.defined()) {
          b.views.back().copy_(grad);
          grad = b.views.back();
        }
      }
      b.pending = vars.size();
      buckets.push_back(std::move(b));
    }
    stats.num_buckets = buckets.size();
    stats.bucket_bytes.clear();
    for (const auto& b : buckets) stats.bucket_bytes.push_back(b.contents.numel() * b.contents.element_size());
  }

  int64_t bytes(double mb) const { return static_cast<int64_t>(mb * 1024 * 1024); }

  void autograd_hook(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    // Usage counts in no_sync backwards too (as PyTorch), so that a parameter
    // used only while accumulating is reduced at the synchronised step.
    if (options.find_unused_parameters() && params[i].grad().defined()) locally_used[i] = 1;
    if (!expect_hooks) return;  // no_sync, or a backward not prepared by a DDP forward
    if (!timing) {
      timing = true;
      first_ready = Clock::now();
    }
    arm_end_of_graph_task();
    if (!unused_marked) {
      unused_marked = true;
      for (size_t u : unused_from_graph) mark_ready(u);
    }
    // Every hook counts, whatever its gradient: every rank then sees a
    // complete order.
    if (should_rebuild()) ready_order.push_back(i);
    mark_ready(i);
  }

  // The end of backward belongs to the outermost backward. A reentrant
  // backward (activation checkpointing) is its own graph task and ends first:
  // a callback is queued on every graph task that fires a hook, and only the
  // one that finds every gradient ready, or that is the backward through the
  // forward's output, finalizes.
  void arm_end_of_graph_task() {
    const void* task = torch::autograd::get_current_graph_task_exec_info();
    if (armed_tasks.count(task)) return;
    bool outer = output_fns.empty();
    if (!outer) {
      if (const auto* nodes = torch::autograd::get_current_graph_task_nodes_in_graph()) {
        for (const auto* fn : output_fns) outer = outer || nodes->count(const_cast<torch::autograd::Node*>(fn)) > 0;
      } else {
        outer = true;
      }
    }
    armed_tasks[task] = outer;
    std::weak_ptr<Impl> weak = shared_from_this();
    // The engine drops a failed graph task, its callbacks unrun, before the
    // exception reaches the caller: the guard's destructor then waits for the
    // collectives this backward launched, so that the caller's next step
    // (zero_grad() on bucket views, the next forward) cannot race with them.
    auto guard = std::make_shared<TaskGuard>(weak, generation);
    torch::autograd::Engine::get_default_engine().queue_callback([weak, task, guard] {
      guard->ended = true;
      if (auto self = weak.lock()) self->end_of_graph_task(task);
    });
  }

  struct TaskGuard {
    TaskGuard(std::weak_ptr<Impl> impl, uint64_t generation) : impl(std::move(impl)), generation(generation) {}
    ~TaskGuard() {
      if (ended) return;  // the graph task finished; its callback did the rest
      if (auto self = impl.lock()) {
        std::lock_guard<std::mutex> lock(self->mutex);
        if (self->generation == generation) self->settle_unfinished();
      }
    }
    TaskGuard(const TaskGuard&) = delete;
    TaskGuard& operator=(const TaskGuard&) = delete;
    std::weak_ptr<Impl> impl;
    uint64_t generation;
    bool ended = false;
  };

  void end_of_graph_task(const void* task) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = armed_tasks.find(task);
    if (it == armed_tasks.end()) return;
    const bool outer = it->second;
    armed_tasks.erase(it);
    if (!expect_hooks) return;
    const bool all_marked = std::all_of(marked.begin(), marked.end(), [](char m) { return m != 0; });
    if (all_marked || (outer && armed_tasks.empty())) finalize_backward();
    // Otherwise a reentrant backward ended inside the outer one, whose hooks
    // and callback are still to come.
  }

  void mark_ready(size_t i) {
    check_usage(!marked[i], who(), "parameter '", names[i],
                "' was marked ready twice in one backward. Either it received a gradient after being found unused "
                "(find_unused_parameters, with a reentrant backward such as activation checkpointing), or the same "
                "parameters were used by two reentrant backward passes, or the module's output was used in two "
                "backward calls.");
    marked[i] = 1;
    divide_factor();
    const auto& slot = slots[i];
    auto& bucket = buckets[slot.bucket];
    copy_grad_to_bucket(i, bucket.views[slot.index]);
    if (--bucket.pending == 0) launch_ready_buckets();
  }

  // As PyTorch's mark_variable_ready_dense: a gradient that is not already
  // the bucket view is scaled by 1/W on its way in (one pass); one that is
  // is divided by W in place; a missing one contributes zeros.
  void copy_grad_to_bucket(size_t i, at::Tensor view) {
    torch::NoGradGuard no_grad;
    auto& grad = params[i].mutable_grad();
    if (!grad.defined()) {
      view.zero_();
      return;
    }
    check_usage(!grad.is_sparse(), who(), "parameter '", names[i],
                "' received a sparse gradient; only dense gradients are supported (construct embeddings with "
                "sparse(false))");
    check_usage(grad.scalar_type() == view.scalar_type(), who(), "parameter '", names[i], "' received a ",
                grad.scalar_type(), " gradient, expected ", view.scalar_type());
    if (comm_hook) {
      // As PyTorch: with a hook the gradients go in as they are; dividing
      // by the world size is the hook's business.
      if (!is_alias(grad, view)) {
        view.copy_(grad.detach());
        if (options.gradient_as_bucket_view()) grad = view;
      }
      return;
    }
    const int64_t div = divide_factor();
    if (!is_alias(grad, view)) {
      if (grad.requires_grad())
        view.copy_(grad.detach().div(div));
      else
        at::mul_out(view, grad, div == pg->size() ? inverse_world : at::native::wrapped_scalar_tensor(1.0 / div));
      if (options.gradient_as_bucket_view()) grad = view;
    } else if (div > 1) {
      view.div_(div);
    }
  }

  void launch_ready_buckets() {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      const size_t index = next_bucket++;
      auto& b = buckets[index];
      if (comm_hook) {
        // As PyTorch, the hook runs at every world size, one included.
        std::vector<at::Tensor> members;
        for (size_t i : b.vars) members.push_back(params[i]);
        GradBucket bucket(index, buckets.size(), b.contents, std::move(members));
        b.future = comm_hook(bucket);
        check_usage(b.future.valid(), who(), "the communication hook returned an empty CommFuture for bucket ",
                    index, "; return the future of the reduced bucket (CommFuture::ready(tensor) if it is done)");
      } else if (pg->size() > 1) {
        b.work = pg->allreduce(b.contents);
      }
    }
    // After the last bucket, which parameters were used anywhere.
    if (next_bucket == buckets.size() && options.find_unused_parameters() && pg->size() > 1 && !used_work.valid()) {
      used_map = torch::from_blob(locally_used.data(), {static_cast<int64_t>(locally_used.size())}, torch::kInt8)
                     .to(torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
      used_work = pg->allreduce(used_map);
    }
  }

  // Collectives this rank launched in an iteration that did not finish
  // (backward threw) must end before their buckets are touched again.
  void settle_unfinished() {
    if (!expect_hooks) return;
    size_t launched = 0;
    std::string failure;
    for (size_t b = 0; b < next_bucket; ++b) {
      ++launched;
      try {
        buckets[b].work.wait();
        if (buckets[b].future.valid()) buckets[b].future.wait();
      } catch (const std::exception& e) {
        if (failure.empty()) failure = e.what();
      }
    }
    try {
      used_work.wait();
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
    if (launched > 0 || std::any_of(marked.begin(), marked.end(), [](char m) { return m != 0; })) {
      std::cerr << who() << "the previous backward did not finish (" << launched << " of " << buckets.size()
                << " bucket all-reduces had started; they were waited for). Ranks whose backward finished wait for "
                   "the rest and fail within the process group's timeout."
                << (failure.empty() ? "" : " The wait failed: " + failure) << std::endl;
    }
    reset_iteration();
  }

  void reset_iteration() {
    std::fill(marked.begin(), marked.end(), 0);
    for (auto& b : buckets) {
      b.pending = b.vars.size();
      b.work = Work();
      b.future = CommFuture();
    }
    used_work = Work();
    next_bucket = 0;
    div_factor = 0;
    expect_hooks = false;
    unused_marked = false;
    timing = false;
    armed_tasks.clear();
    unused_from_graph.clear();
  }

  void finalize_backward() {
    const auto backward_end = Clock::now();
    torch::NoGradGuard no_grad;
    if (options.find_unused_parameters()) {
      // Parameters in the graph whose hook never fired count as unused too.
      unused_marked = true;
      for (size_t i = 0; i < params.size(); ++i)
        if (!marked[i]) mark_ready(i);
    }

    if (next_bucket < buckets.size()) {
      std::ostringstream missing;
      size_t count = 0;
      for (size_t i = 0; i < params.size(); ++i)
        if (!marked[i]) missing << (count++ ? ", " : "") << "'" << names[i] << "'";
      for (size_t b = 0; b < next_bucket; ++b) {
        try {
          buckets[b].work.wait();
          if (buckets[b].future.valid()) buckets[b].future.wait();
        } catch (const std::exception&) {
        }
      }
      reset_iteration();
      check_usage(false, who(), "backward finished, but ", count,
                  " parameter(s) received no gradient, so the gradient reduction could not finish: ",
                  missing.str(),
                  ".\n  Either make every parameter contribute to the loss, or construct with "
                  "ddp::DDPOptions().find_unused_parameters(true).");
    }

    const auto wait_start = Clock::now();
    for (size_t k = 0; k < buckets.size(); ++k) {
      auto& b = buckets[k];
      b.work.wait();
      if (b.future.valid()) take_hook_result(k, b.future.wait());
    }
    used_work.wait();
    const auto wait_end = Clock::now();
    const int32_t* used_anywhere = nullptr;
    at::Tensor used_cpu;
    if (used_map.defined() && used_work.valid()) {
      used_cpu = used_map.cpu();
      used_anywhere = used_cpu.data_ptr<int32_t>();
    }

    const bool as_view = options.gradient_as_bucket_view();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& view = buckets[slots[i].bucket].views[slots[i].index];
      auto& grad = params[i].mutable_grad();
      if (options.find_unused_parameters()) {
        // A parameter no rank used keeps its gradient untouched (undefined
        // stays undefined, so optimizers skip it), as PyTorch.
        const bool used = locally_used[i] || (used_anywhere ? used_anywhere[i] > 0 : false);
        if (!used) continue;
      }
      if (as_view) {
        if (!is_alias(grad, view)) grad = view;
      } else if (!grad.defined()) {
        grad = torch::autograd::utils::clone_obey_contract(view, params[i]);
      } else {
        grad.copy_(view);
      }
    }
    std::fill(locally_used.begin(), locally_used.end(), 0);

    stats.iterations++;
    stats.bytes_reduced = 0;
    for (const auto& b : buckets) stats.bytes_reduced += b.contents.numel() * b.contents.element_size();
    stats.backward_ms = std::chrono::duration<double, std::milli>(backward_end - first_ready).count();
    stats.exposed_comm_ms = std::chrono::duration<double, std::milli>(wait_end - wait_start).count();

    // Every rank that finishes its first synchronised backward rebuilds
    // before its next forward, so all take part in the broadcast.
    if (should_rebuild()) rebuild_pending = true;
    reset_iteration();
  }

  // The hook's reduced bucket goes where the built-in all-reduce leaves its
  // result, the bucket's own tensor (PyTorch points its output views at the
  // result instead; the values the gradients get are the same, a float16
  // result included: widening to float32 is exact).
  void take_hook_result(size_t index, const at::Tensor& result) {
    auto& b = buckets[index];
    check_usage(result.defined() && result.numel() == b.contents.numel(), who(), "the communication hook's result for bucket ",
                index, " has ", result.defined() ? result.numel() : 0, " elements, the bucket ", b.contents.numel(),
                "; return a tensor of the bucket's size (the reduced bucket.buffer())");
    if (result.data_ptr() == b.contents.data_ptr() && result.scalar_type() == b.contents.scalar_type()) return;
    b.contents.copy_(result.reshape({-1}));
  }

  void rebuild_buckets() {
    // Every rank adopts rank 0's order, so buckets (and collectives) match.
    // The first element says whether rank 0's order is complete.
    std::vector<int64_t> message(params.size() + 1, -1);
    message[0] = ready_order.size() == params.size() ? 1 : 0;
    for (size_t k = 0; k < ready_order.size() && k < params.size(); ++k)
      message[k + 1] = static_cast<int64_t>(ready_order[k]);
    auto tensor = torch::tensor(message, torch::kInt64).to(pg->device());
    if (pg->size() > 1) pg->broadcast(tensor, 0).wait();
    auto cpu = tensor.cpu();
    const int64_t* data = cpu.data_ptr<int64_t>();
    rebuilt = true;
    ready_order.clear();
    if (data[0] != 1) return;  // rank 0 did not see every hook: keep the buckets
    std::vector<size_t> agreed(data + 1, data + 1 + params.size());
    auto assignment =
        compute_bucket_assignment(params, agreed, bytes(options.first_bucket_mb()), bytes(options.bucket_cap_mb()));
    // Often the real order packs the same buckets as the guess: then
    // reallocating would only cost a bucket's worth of peak memory and a copy
    // of every gradient. Every rank sees the same order and the same buckets,
    // so all of them decide alike.
    bool same = assignment.size() == buckets.size();
    for (size_t b = 0; same && b < buckets.size(); ++b) same = assignment[b] == buckets[b].vars;
    if (!same) initialize_buckets(assignment);
    stats.buckets_rebuilt = true;
  }

  // ---- ddp::Join --------------------------------------------------------

  // As PyTorch's set_divide_factor: the world size, or under Join with
  // divide_by_initial_world_size(false) the ranks still training.
  int64_t divide_factor() {
    if (div_factor == 0) {
      div_factor = pg->size();
      if (divide_by_nonjoined && nonjoined.valid())
        div_factor = static_cast<int64_t>(nonjoined.wait().item<float>());
    }
    return div_factor;
  }

  // A joined rank's zeros for each bucket, in the order the others launch
  // them, then its used map (the last one it reduced, as PyTorch's
  // local_used_map_dev_); its rebuild order, if still pending, is the
  // parameters' (PyTorch's _push_all_rebuilt_params).
  void shadow_backward() {
    torch::NoGradGuard no_grad;
    std::vector<Work> works;
    std::vector<CommFuture> futures;
    for (size_t k = 0; k < buckets.size(); ++k) {
      auto zeros = at::zeros_like(buckets[k].contents);
      if (comm_hook) {
        std::vector<at::Tensor> members;
        for (size_t i : buckets[k].vars) members.push_back(params[i]);
        GradBucket bucket(k, buckets.size(), zeros, std::move(members));
        futures.push_back(comm_hook(bucket));
      } else if (pg->size() > 1) {
        works.push_back(pg->allreduce(zeros));
      }
    }
    for (auto& w : works) w.wait();
    for (auto& f : futures)
      if (f.valid()) f.wait();
    if (options.find_unused_parameters() && pg->size() > 1) {
      if (!used_map.defined())
        used_map = torch::zeros({static_cast<int64_t>(params.size())},
                                torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
      pg->allreduce(used_map).wait();
    }
    if (should_rebuild()) {
      if (ready_order.empty())
        for (size_t i = 0; i < params.size(); ++i) ready_order.push_back(i);
      rebuild_pending = true;
    }
  }

  void find_unused(const std::vector<at::Tensor>& outputs) {
    std::unordered_set<torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> stack;
    for (const auto& t : outputs)
      if (t.defined() && t.grad_fn()) stack.push_back(t.grad_fn().get());
    while (!stack.empty()) {
      auto* node = stack.back();
      stack.pop_back();
      if (!seen.insert(node).second) continue;
      for (const auto& edge : node->next_edges())
        if (edge.function) stack.push_back(edge.function.get());
    }
    unused_from_graph.clear();
    if (outputs.empty()) return;  // nothing to look at: the end of backward will tell
    for (size_t i = 0; i < params.size(); ++i)
      if (!seen.count(accumulators[i].get())) unused_from_graph.push_back(i);
  }
};

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> pg,
                 const DDPOptions& options)
    : impl_(std::make_shared<Impl>()) {
  TORCH_CHECK(params.size() == names.size(), "Reducer: one name per parameter");
  TORCH_CHECK(!params.empty(), "Reducer: no parameters");
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    check_usage(!params[i].is_sparse(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '", names[i],
                "' is sparse; only dense parameters are supported");
    check_usage(seen.insert(params[i].unsafeGetTensorImpl()).second, "rank ", pg->rank(),
                ": DistributedDataParallel: parameter '", names[i],
                "' is given twice; pass each shared tensor once (DistributedDataParallel deduplicates them)");
    check_usage(params[i].device() == pg->device(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '",
                names[i], "' is on ", params[i].device().str(), " but the ", pg->backend_name(), " process group works on ",
                pg->device().str(), "; move the model there first (model->to(pg->device()))");
  }
  auto& s = *impl_;
  s.params = std::move(params);
  s.names = std::move(names);
  s.pg = std::move(pg);
  s.options = options;
  s.inverse_world = at::native::wrapped_scalar_tensor(1.0 / s.pg->size());
  s.marked.assign(s.params.size(), 0);
  s.locally_used.assign(s.params.size(), 0);
  s.register_hooks();
  s.initialize_buckets(initial_bucket_assignment(s.params, s.bytes(options.first_bucket_mb()),
                                                 s.bytes(options.bucket_cap_mb()), options.find_unused_parameters()));
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  s.settle_unfinished();
  if (s.rebuild_pending) {
    s.rebuild_pending = false;
    s.rebuild_buckets();
  }
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  s.settle_unfinished();
  if (!s.sync) return;
  s.expect_hooks = true;
  ++s.generation;
  if (s.should_rebuild()) s.ready_order.clear();
  s.output_fns.clear();
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) s.output_fns.insert(t.grad_fn().get());
  if (s.options.find_unused_parameters()) s.find_unused(outputs);
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sync = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->sync;
}

void Reducer::register_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  check_usage(static_cast<bool>(hook), s.who(), "register_comm_hook was given an empty hook");
  // PyTorch's own words for the first; the second keeps a bucket from being
  // reduced half one way, half the other.
  check_usage(!s.comm_hook, s.who(), "register_comm_hook or register_builtin_comm_hook can only be called once.");
  check_usage(s.generation == 0 && s.stats.iterations == 0, s.who(),
              "register_comm_hook must be called before the first forward and backward that synchronise gradients; "
              "register the hook right after constructing DistributedDataParallel.");
  s.comm_hook = std::move(hook);
}

bool Reducer::has_comm_hook() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return static_cast<bool>(impl_->comm_hook);
}

void Reducer::set_forward_pass_work(CommFuture nonjoined, bool divide_by_nonjoined) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  if (s.nonjoined.valid()) s.nonjoined.wait();  // the last forward's count: every rank launched it
  s.nonjoined = std::move(nonjoined);
  s.divide_by_nonjoined = divide_by_nonjoined;
}

void Reducer::join_shadow_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  if (s.rebuild_pending) {
    s.rebuild_pending = false;
    s.rebuild_buckets();
  }
}

void Reducer::join_shadow_backward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->shadow_backward();
}

const ReducerStats& Reducer::stats() const { return impl_->stats; }

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::vector<size_t>> out;
  for (const auto& b : impl_->buckets) out.push_back(b.vars);
  return out;
}

}  // namespace ddp
