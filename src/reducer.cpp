#include "ddp/reducer.h"

#include "bucket_autotune.h"
#include "stall_inspector.h"
#include "usage_check.h"

#include "ddp/timeline.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/grad_layout_contract.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
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
    // Timeline only: when its last gradient arrived and it was launched
    // (microseconds on the timeline's clock), and whether the backend will
    // say when it ends (else finalize notes the end of its wait).
    int64_t ready_us = 0, launch_us = 0;
    bool end_reported = false;
  };

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps our hooks alive across iterations
  at::Tensor inverse_world;  // 1/W as a wrapped scalar, as PyTorch's mul_out takes it
  CommHook comm_hook;        // empty: the built-in all-reduce
  std::shared_ptr<Timeline> timeline;  // null: none (DDP_TIMELINE unset)
  std::unique_ptr<StallInspector> stall;  // null: off
  int64_t backward_start_us = 0;

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

  // static_graph: the first synchronised iteration counts each parameter's
  // hooks and reduces after backward; later ones mark a parameter ready at
  // its last hook, and the parameters no hook reached then at the first hook.
  int64_t sync_forwards = 0;         // forwards that prepared a synchronised backward
  std::vector<int> hook_counts;      // hooks per parameter in the first iteration
  std::vector<int> hooks_left;       // this iteration's, counting down
  std::vector<size_t> static_unused;  // no hook in the first iteration, on this rank
  std::vector<char> used_globally;   // got a gradient on some rank in the first iteration

  bool rebuilt = false;          // buckets follow a recorded ready order
  bool rebuild_pending = false;  // the first synchronised backward finished: rebuild before the next forward
  std::vector<size_t> ready_order;
  Clock::time_point first_ready;
  bool timing = false;
  // The runtime figures of PyTorch's DDP logging data (ReducerStats).
  Clock::time_point forward_start, output_ready, comm_start;
  std::vector<size_t> step_ready_order;  // this backward's, every hook

  // bucket_cap_mb("auto"). The buckets are laid out along layout_order (the
  // agreed ready order; empty: registration order reversed).
  std::vector<size_t> layout_order;
  std::unique_ptr<BucketAutotune> autotune;
  bool autotune_finished = false;
  double pending_cap_mb = 0;  // lay the buckets out for this cap before the next forward (0: no change)

  ReducerStats stats;
  mutable std::mutex mutex;

  // ddp::Join: the divisor of this backward's gradients, read from the
  // forward's count of ranks still training (0: not read yet).
  CommFuture nonjoined;
  bool divide_by_nonjoined = false;
  int64_t div_factor = 0;

  std::string who() const { return "rank " + std::to_string(pg->rank()) + ": DistributedDataParallel: "; }
  // As PyTorch 1.13: a static graph rebuilds after its second iteration
  // (the first records no ready order), whatever find_unused_parameters says.
  bool should_rebuild() const {
    return !rebuilt && (options.static_graph() || !options.find_unused_parameters());
  }
  bool dynamic_find_unused() const { return options.find_unused_parameters() && !options.static_graph(); }
  bool static_first_iteration() const { return options.static_graph() && sync_forwards == 1; }
  bool static_after_first_iteration() const { return options.static_graph() && sync_forwards > 1; }

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
    if (stall) {
      // What each bucket holds, for the stall report; the usage map last.
      std::vector<std::string> holds;
      for (const auto& b : buckets) {
        std::string s = std::to_string(b.vars.size()) + " parameter(s), " +
                        std::to_string(b.contents.numel() * b.contents.element_size()) + " bytes: ";
        for (size_t k = 0; k < b.vars.size() && k < 8; ++k) s += (k ? ", " : "") + names[b.vars[k]];
        if (b.vars.size() > 8) s += ", ...";
        holds.push_back(std::move(s));
      }
      holds.push_back("the map of parameters used on each rank");
      stall->set_buckets(std::move(holds));
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
    if (dynamic_find_unused() && params[i].grad().defined()) locally_used[i] = 1;
    if (!expect_hooks) return;  // no_sync, or a backward not prepared by a DDP forward
    if (!timing) {
      timing = true;
      first_ready = Clock::now();
      if (timeline) backward_start_us = timeline->now_us();
    }
    arm_end_of_graph_task();
    if (static_first_iteration()) {
      // Only counted: everything is reduced once backward has ended.
      if (params[i].grad().defined()) locally_used[i] = 1;
      ++hook_counts[i];
      return;
    }
    if (!unused_marked) {
      unused_marked = true;
      for (size_t u : options.static_graph() ? static_unused : unused_from_graph) mark_ready(u);
    }
    if (static_after_first_iteration()) {
      check_usage(hooks_left[i] > 0, who(), "parameter '", names[i], "' received ",
                  hook_counts[i] == 0 ? "a gradient, but it received none"
                                      : "more gradients than the " + std::to_string(hook_counts[i]),
                  " in the first iteration. The training graph changed, which static_graph(true) does not allow; "
                  "construct DistributedDataParallel without static_graph (with find_unused_parameters(true) if "
                  "some parameters go unused in some iterations).");
      if (--hooks_left[i] > 0) return;  // its last gradient of this backward is still to come
    }
    // Every hook counts, whatever its gradient: every rank then sees a
    // complete order.
    if (should_rebuild()) ready_order.push_back(i);
    step_ready_order.push_back(i);
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
    if (--bucket.pending == 0) {
      if (timeline) note_ready(slot.bucket);
      launch_ready_buckets();
    }
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
      if (index == 0) comm_start = Clock::now();
      // Before the collective starts: its end can then never precede it.
      if (timeline) b.launch_us = timeline->now_us();
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
      if (timeline) note_launch(index);
    }
    // After the last bucket, which parameters were used anywhere.
    if (next_bucket == buckets.size() && dynamic_find_unused()) launch_used_map();
  }

  // The timeline's view of a bucket (ddp/timeline.h): ready on the compute
  // row, launched and done on the communication row.
  std::string bucket_args(size_t k) const {
    const auto& b = buckets[k];
    return "\"bucket\": " + std::to_string(k) + ", \"bytes\": " +
           std::to_string(b.contents.numel() * b.contents.element_size()) + ", \"parameters\": " +
           std::to_string(b.vars.size()) + ", \"ready_us\": " + std::to_string(b.ready_us) +
           ", \"launch_us\": " + std::to_string(b.launch_us);
  }

  void note_ready(size_t k) {
    buckets[k].ready_us = timeline->now_us();
    timeline->instant(Timeline::Row::compute, "bucket " + std::to_string(k) + " ready", buckets[k].ready_us,
                      "\"bucket\": " + std::to_string(k));
  }

  void note_launch(size_t k) {
    auto& b = buckets[k];
    const std::string args = bucket_args(k);
    timeline->bucket_launched(static_cast<int>(k), b.launch_us, args);
    // The backend's thread reports the end; it must not take this reducer's
    // lock, which the thread waiting for that end may hold.
    std::weak_ptr<Timeline> weak = timeline;
    b.end_reported = b.work.valid() && b.work.on_complete([weak, k, launch = b.launch_us, args] {
      if (auto t = weak.lock()) t->communication_done("bucket " + std::to_string(k), launch, args);
    });
  }

  void launch_used_map() {
    if (pg->size() == 1 || used_work.valid()) return;
    used_map = torch::from_blob(locally_used.data(), {static_cast<int64_t>(locally_used.size())}, torch::kInt8)
                   .to(torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
    used_work = pg->allreduce(used_map);
  }

  // The end of a static graph's first backward, as PyTorch's
  // delay_all_reduce: the parameters no hook reached are this rank's unused
  // ones from now on; which ones any rank used is all-reduced once; every
  // gradient goes into its bucket and every bucket is reduced, in order.
  void reduce_after_first_static_backward() {
    static_unused.clear();
    for (size_t i = 0; i < params.size(); ++i)
      if (hook_counts[i] == 0) static_unused.push_back(i);
    launch_used_map();
    for (size_t i = 0; i < params.size(); ++i) {
      marked[i] = 1;
      copy_grad_to_bucket(i, buckets[slots[i].bucket].views[slots[i].index]);
    }
    for (size_t k = 0; k < buckets.size(); ++k) {
      buckets[k].pending = 0;
      if (timeline) note_ready(k);
    }
    launch_ready_buckets();
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
    step_ready_order.clear();
    armed_tasks.clear();
    unused_from_graph.clear();
  }

  void finalize_backward() {
    const auto backward_end = Clock::now();
    torch::NoGradGuard no_grad;
    int64_t unused_bytes = 0;
    if (static_first_iteration()) {
      reduce_after_first_static_backward();
    } else if (dynamic_find_unused()) {
      for (size_t u : unused_from_graph) unused_bytes += param_bytes(u);
      // Parameters in the graph whose hook never fired count as unused too.
      unused_marked = true;
      for (size_t i = 0; i < params.size(); ++i)
        if (!marked[i]) {
          unused_bytes += param_bytes(i);
          mark_ready(i);
        }
    } else if (options.static_graph()) {
      for (size_t u : static_unused) unused_bytes += param_bytes(u);
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
      if (options.static_graph())
        check_usage(false, who(), "backward finished, but ", count, " parameter(s) received fewer gradients than in the "
                    "first iteration, so the gradient reduction could not finish: ", missing.str(),
                    ".\n  The training graph changed, which static_graph(true) does not allow; construct "
                    "DistributedDataParallel without static_graph (with find_unused_parameters(true) if some "
                    "parameters go unused in some iterations).");
      check_usage(false, who(), "backward finished, but ", count,
                  " parameter(s) received no gradient, so the gradient reduction could not finish: ",
                  missing.str(),
                  ".\n  Either make every parameter contribute to the loss, or construct with "
                  "ddp::DDPOptions().find_unused_parameters(true).");
    }

    const auto wait_start = Clock::now();
    const int64_t wait_start_us = timeline ? timeline->now_us() : 0;
    struct DoneWaiting {  // also when a wait throws
      StallInspector* stall;
      ~DoneWaiting() {
        if (stall) stall->done_waiting();
      }
    } done_waiting{stall.get()};
    for (size_t k = 0; k < buckets.size(); ++k) {
      auto& b = buckets[k];
      if (stall) stall->waiting(stats.iterations, static_cast<int>(k), static_cast<int>(next_bucket));
      b.work.wait();
      if (b.future.valid()) take_hook_result(k, b.future.wait());
      if (timeline && !b.end_reported)
        timeline->communication_done("bucket " + std::to_string(k), b.launch_us, bucket_args(k));
    }
    if (stall) stall->waiting(stats.iterations, static_cast<int>(buckets.size()), static_cast<int>(next_bucket));
    used_work.wait();
    const auto wait_end = Clock::now();
    if (timeline) {
      timeline->span(Timeline::Row::compute, "backward", backward_start_us, wait_start_us);
      timeline->span(Timeline::Row::compute, "wait for communication", wait_start_us, timeline->now_us());
    }
    const int32_t* used_anywhere = nullptr;
    at::Tensor used_cpu;
    if (used_map.defined() && used_work.valid()) {
      used_cpu = used_map.cpu();
      used_anywhere = used_cpu.data_ptr<int32_t>();
    }

    if (static_first_iteration()) {
      used_globally.assign(params.size(), 1);
      for (size_t i = 0; i < params.size(); ++i)
        used_globally[i] = locally_used[i] || (used_anywhere ? used_anywhere[i] > 0 : false);
    }
    const bool as_view = options.gradient_as_bucket_view();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& view = buckets[slots[i].bucket].views[slots[i].index];
      auto& grad = params[i].mutable_grad();
      // A parameter no rank used keeps its gradient untouched (undefined
      // stays undefined, so optimizers skip it), as PyTorch; a static graph's
      // usage is the first iteration's.
      if (options.static_graph() && !used_globally[i]) continue;
      if (dynamic_find_unused()) {
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
    if (timeline) {
      timeline->set_step(stats.iterations);
      if (timeline->skew_due()) timeline->report_skew();
    }
    stats.bytes_reduced = 0;
    for (const auto& b : buckets) stats.bytes_reduced += b.contents.numel() * b.contents.element_size();
    stats.backward_ms = std::chrono::duration<double, std::milli>(backward_end - first_ready).count();
    stats.exposed_comm_ms = std::chrono::duration<double, std::milli>(wait_end - wait_start).count();
    record_runtime(backward_end, wait_end, unused_bytes);

    // Every rank that finishes its first synchronised backward (a static
    // graph's second) rebuilds before its next forward, so all take part in
    // the broadcast.
    if (should_rebuild() && !static_first_iteration()) rebuild_pending = true;
    if (static_after_first_iteration() && should_rebuild())
      ready_order.insert(ready_order.end(), static_unused.begin(), static_unused.end());
    reset_iteration();
    autotune_after_step(stats.backward_ms + stats.exposed_comm_ms);
  }

  int64_t param_bytes(size_t i) const { return params[i].numel() * params[i].element_size(); }

  static double ms_between(Clock::time_point from, Clock::time_point to) {
    return std::max(0.0, std::chrono::duration<double, std::milli>(to - from).count());
  }

  // PyTorch's DDP logging data's runtime figures for the step that ends now,
  // and their running means.
  void record_runtime(Clock::time_point backward_end, Clock::time_point comm_end, int64_t unused_bytes) {
    stats.forward_ms = ms_between(forward_start, output_ready);
    stats.backward_compute_ms = ms_between(output_ready, backward_end);
    const bool launched = !buckets.empty() && (pg->size() > 1 || comm_hook);
    stats.comm_ms = launched ? ms_between(comm_start, comm_end) : 0;
    stats.overlap_ms = launched ? ms_between(comm_start, backward_end) : 0;
    // Steady times as system-clock ns, for PyTorch's *_time_start/_end.
    const auto steady_now = Clock::now();
    const auto system_now = std::chrono::system_clock::now().time_since_epoch();
    auto wall_ns = [&](Clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(system_now - (steady_now - t)).count();
    };
    stats.at_ns = {wall_ns(forward_start), wall_ns(output_ready), wall_ns(backward_end),
                   launched ? wall_ns(comm_start) : 0, launched ? wall_ns(comm_end) : 0};
    stats.unused_parameter_bytes = unused_bytes;
    stats.ready_order.swap(step_ready_order);  // reset_iteration() clears the other, keeping its capacity
    const double n = static_cast<double>(stats.iterations);
    auto& m = stats.mean;
    m.forward_ms += (stats.forward_ms - m.forward_ms) / n;
    m.backward_compute_ms += (stats.backward_compute_ms - m.backward_compute_ms) / n;
    m.comm_ms += (stats.comm_ms - m.comm_ms) / n;
    m.overlap_ms += (stats.overlap_ms - m.overlap_ms) / n;
    m.exposed_comm_ms += (stats.exposed_comm_ms - m.exposed_comm_ms) / n;
  }

  // ---- bucket_cap_mb("auto") --------------------------------------------

  std::vector<std::vector<size_t>> layout_for(double cap_mb) const {
    const int64_t cap = bytes(cap_mb), first = bytes(options.first_bucket_mb());
    return layout_order.empty() ? initial_bucket_assignment(params, first, cap, true)
                                : compute_bucket_assignment(params, layout_order, first, cap);
  }

  void lay_out_for(double cap_mb) {
    adopt_buckets(layout_for(cap_mb));
    stats.bucket_cap_mb = cap_mb;
  }

  // After every synchronised step, a shadowed one under Join included (`ms`
  // 0 then), so that every rank changes buckets at the same step. Tuning
  // starts once the buckets follow the real ready order.
  void autotune_after_step(double ms) {
    if (!options.bucket_cap_auto() || autotune_finished || should_rebuild() || rebuild_pending) return;
    if (!autotune) {
      // Only caps that pack different buckets are worth a trial.
      std::vector<double> caps;
      std::vector<std::vector<std::vector<size_t>>> seen;
      for (double cap : options.bucket_cap_candidates_mb()) {
        auto layout = layout_for(cap);
        if (std::find(seen.begin(), seen.end(), layout) != seen.end()) continue;
        seen.push_back(std::move(layout));
        caps.push_back(cap);
      }
      autotune = std::make_unique<BucketAutotune>(caps, DDPOptions::kAutoBucketCapWarmupSteps,
                                                  DDPOptions::kAutoBucketCapTimedSteps);
      pending_cap_mb = autotune->current_cap_mb();
      if (caps.size() == 1) finish_autotune();
      return;
    }
    switch (autotune->after_step(ms)) {
      case BucketAutotune::Next::keep:
        return;
      case BucketAutotune::Next::switch_:
        pending_cap_mb = autotune->current_cap_mb();
        return;
      case BucketAutotune::Next::agree:
        pending_cap_mb = autotune->agree(*pg);
        for (const auto& t : autotune->trials()) stats.bucket_cap_trials.emplace_back(t.cap_mb, t.ms);
        if (pg->rank() == 0)
          std::cout << who() << "bucket_cap_mb auto: " << autotune->summary() << std::endl;
        finish_autotune();
        return;
    }
  }

  void finish_autotune() {
    autotune_finished = true;
    stats.bucket_cap_tuning = false;
  }

  void apply_pending_cap() {
    if (pending_cap_mb > 0) lay_out_for(pending_cap_mb);
    pending_cap_mb = 0;
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
    layout_order = agreed;
    adopt_buckets(
        compute_bucket_assignment(params, agreed, bytes(options.first_bucket_mb()), bytes(options.bucket_cap_mb())));
    stats.buckets_rebuilt = true;
  }

  // Often a new order or cap packs the same buckets as before: then
  // reallocating would only cost a bucket's worth of peak memory and a copy
  // of every gradient. Every rank sees the same assignment, so all of them
  // decide alike.
  void adopt_buckets(const std::vector<std::vector<size_t>>& assignment) {
    bool same = assignment.size() == buckets.size();
    for (size_t b = 0; same && b < buckets.size(); ++b) same = assignment[b] == buckets[b].vars;
    if (!same) initialize_buckets(assignment);
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
    // The others' iteration counts as this rank's: a static graph's first
    // iteration reduces the used map first and rebuilds nothing, later ones
    // reduce no map.
    if (sync) ++sync_forwards;
    if (static_first_iteration() && pg->size() > 1) {
      auto zeros = torch::zeros({static_cast<int64_t>(params.size())},
                                torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
      pg->allreduce(zeros).wait();
    }
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
    if (dynamic_find_unused() && pg->size() > 1) {
      if (!used_map.defined())
        used_map = torch::zeros({static_cast<int64_t>(params.size())},
                                torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
      pg->allreduce(used_map).wait();
    }
    if (should_rebuild() && !static_first_iteration()) {
      if (ready_order.empty())
        for (size_t i = 0; i < params.size(); ++i) ready_order.push_back(i);
      rebuild_pending = true;
    }
    if (timeline) {  // the step counts here too, so that the skew reports' gathers match
      timeline->set_step(timeline->step() + 1);
      if (timeline->skew_due()) timeline->report_skew();
    }
    autotune_after_step(0);
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
  s.hook_counts.assign(s.params.size(), 0);
  if (options.bucket_cap_auto()) {
    const auto& caps = options.bucket_cap_candidates_mb();
    check_usage(!caps.empty(), s.who(), "bucket_cap_mb(\"auto\") has no candidate cap to try; give "
                "bucket_cap_candidates_mb at least one size in MiB");
    for (double cap : caps)
      check_usage(cap > 0 && std::isfinite(cap), s.who(), "bucket_cap_candidates_mb holds ", cap,
                  "; every candidate must be a positive number of MiB");
  }
  s.stats.bucket_cap_mb = options.bucket_cap_mb();
  s.stats.bucket_cap_tuning = options.bucket_cap_auto();
  if (const auto threshold = StallInspector::threshold_for(options.stall_check_seconds(), *s.pg);
      threshold.count() > 0 && s.pg->size() > 1) {
    static std::atomic<int> models{0};
    s.stall = std::make_unique<StallInspector>(s.pg, threshold, models++);
  }
  s.register_hooks();
  // As PyTorch 1.13, a static graph starts with one bucket per dtype, as
  // when find_unused_parameters is off: its first iteration reduces after
  // backward anyway.
  s.initialize_buckets(initial_bucket_assignment(s.params, s.bytes(options.first_bucket_mb()),
                                                 s.bytes(options.bucket_cap_mb()),
                                                 options.find_unused_parameters() && !options.static_graph()));
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  s.settle_unfinished();
  s.forward_start = Clock::now();
  if (s.sync) ++s.sync_forwards;
  if (s.rebuild_pending) {
    s.rebuild_pending = false;
    s.rebuild_buckets();
  }
  s.apply_pending_cap();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  s.settle_unfinished();
  if (!s.sync) return;
  s.output_ready = Clock::now();
  s.expect_hooks = true;
  ++s.generation;
  if (s.should_rebuild()) s.ready_order.clear();
  s.hooks_left = s.hook_counts;
  s.output_fns.clear();
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) s.output_fns.insert(t.grad_fn().get());
  if (s.dynamic_find_unused()) s.find_unused(outputs);
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

void Reducer::set_timeline(std::shared_ptr<Timeline> timeline) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->timeline = std::move(timeline);
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
  s.apply_pending_cap();
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
