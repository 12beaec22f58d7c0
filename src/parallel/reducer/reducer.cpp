// The reducer's hot path, top to bottom: an autograd hook fires for a
// parameter -> its gradient is marked ready and copied into its bucket ->
// a bucket whose gradients are all in is launched (through the comm hook;
// the built-in one all-reduces),
// strictly in bucket order -> at the end of backward every bucket is waited
// for and the averages go back to .grad. Then the failure paths and what
// happens between steps (the rebuild, the bucket size), and the public
// Reducer. The state lives in parts (reducer_impl.h); PyTorch's
// reducer.cpp is the reference for every rule here.
#include "parallel/reducer/reducer_impl.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include "ddp/observe/timeline.h"
#include "usage_check.h"

namespace ddp {

using detail::Clock;

Reducer::Impl::Impl(std::vector<at::Tensor> params_, std::vector<std::string> names_,
                    std::shared_ptr<ProcessGroup> pg_, const DDPOptions& options_)
    : params(std::move(params_)),
      names(std::move(names_)),
      pg(std::move(pg_)),
      options(options_),
      inverse_world(at::native::wrapped_scalar_tensor(1.0 / pg->size())),
      usage(params.size(), options),
      marked(params.size(), 0) {}

void Reducer::Impl::register_hooks() {
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

// ---- 1. a parameter's gradient is accumulated ---------------------------

void Reducer::Impl::autograd_hook(size_t i) {
  std::lock_guard<std::mutex> lock(mutex);
  usage.note_hook(i, params[i].grad().defined());
  if (!expect_hooks) return;  // no_sync, or a backward not prepared by a DDP forward
  if (!backward_started) {
    backward_started = true;
    observers.each([](auto& o) { o.backward_started(); });
  }
  arm_end_of_graph_task();
  if (usage.static_first_iteration()) {
    // Only counted: everything is reduced once backward has ended.
    usage.count_first_iteration_hook(i, params[i].grad().defined());
    return;
  }
  if (!unused_marked) {
    unused_marked = true;
    readying_unused = true;
    for (size_t u : usage.unused()) mark_ready(u);
    readying_unused = false;
  }
  // Its last gradient of this backward may still be to come. A gradient
  // the first iteration did not have fails this backward, and, as PyTorch,
  // every forward after it.
  if (usage.static_after_first_iteration()) {
    bool last = false;
    try {
      last = usage.last_hook(i, who(), names[i]);
    } catch (const UsageError& e) {
      unfinished_reduction = who() + "expected to have finished reduction in the prior iteration before starting a "
                             "new one; the prior backward failed: " + e.what();
      unfinished_raised = true;  // this backward raises it
      throw;
    }
    if (!last) return;
  }
  // Every hook counts, whatever its gradient: every rank then sees a
  // complete order.
  if (should_rebuild()) ready_order.push_back(i);
  step_ready_order.push_back(i);
  mark_ready(i);
}

// The end of backward belongs to the outermost backward (graph_tasks.h): a
// callback is queued on every graph task that fires a hook.
void Reducer::Impl::arm_end_of_graph_task() {
  const void* task = nullptr;
  if (!graph_tasks.arm_current(task)) return;
  std::weak_ptr<Impl> weak = shared_from_this();
  // The engine drops a failed graph task, its callbacks unrun, before the
  // exception reaches the caller: the guard's destructor then waits for the
  // collectives this backward launched, so that the caller's next step
  // (zero_grad() on bucket views, the next forward) cannot race with them.
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
  auto guard = std::make_shared<TaskGuard>(weak, generation);
  torch::autograd::Engine::get_default_engine().queue_callback([weak, task, guard] {
    guard->ended = true;
    if (auto self = weak.lock()) self->end_of_graph_task(task);
  });
}

// ---- 2. it is marked ready and goes into its bucket ---------------------

void Reducer::Impl::mark_ready(size_t i) {
  if (marked[i])  // (who() builds a string: only on the way to the error)
    check_usage(false, who(), "parameter '", names[i],
                "' was marked ready twice in one backward. Either it received a gradient after being found unused "
                "(find_unused_parameters, with a reentrant backward such as activation checkpointing), or the same "
                "parameters were used by two reentrant backward passes, or the module's output was used in two "
                "backward calls.");
  marked[i] = 1;
  divisor.get(pg->size());
  const size_t k = buckets.bucket_of(i);
  copy_grad_to_bucket(i, buckets.view_of(i));
  if (--buckets[k].pending == 0) {
    observers.each([k](auto& o) { o.bucket_ready(k); });
    launch_ready_buckets();
  }
}

// copy_grad_to_bucket(): gradient_copies.cpp.

// ---- 3. full buckets launch, in order -----------------------------------

void Reducer::Impl::launch_ready_buckets(bool may_skip) {
  while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
    const size_t k = next_bucket++;
    auto& b = buckets[k];
    if (may_skip && skips(k)) {
      skipped.push_back(k);
      continue;
    }
    observers.each([k](auto& o) { o.bucket_launching(k); });
    b.reduced = launch(k, b.contents);
    observers.each([k, &b](auto& o) { o.bucket_launched(k, b); });
  }
  // After the last bucket, which parameters were used anywhere.
  if (next_bucket == buckets.size() && usage.dynamic()) usage.launch_used_map(*pg);
}

// skip_all_reduce_unused_params: bucket k's parameters all went unused on
// this rank (found in the graph; a static graph's, after its first
// iteration), as PyTorch's should_skip_all_reduce_bucket.
bool Reducer::Impl::skips(size_t k) const {
  if (!options.skip_all_reduce_unused_params()) return false;
  const auto& unused = usage.unused();
  return std::all_of(buckets[k].vars.begin(), buckets[k].vars.end(),
                     [&](size_t i) { return std::find(unused.begin(), unused.end(), i) != unused.end(); });
}

// Bucket k's reduction, of `contents` (its own; a joined rank's zeros),
// through the registered hook or the built-in one. As PyTorch, the hook runs
// at every world size, one included.
CommFuture Reducer::Impl::launch(size_t k, const at::Tensor& contents) {
  if (!hook_registered()) return allreduce_by_sum(contents);
  std::vector<at::Tensor> members;
  members.reserve(buckets[k].vars.size());
  for (size_t i : buckets[k].vars) members.push_back(params[i]);
  GradBucket bucket(k, buckets.size(), contents, std::move(members));
  CommFuture reduced = comm_hook(bucket);
  check_usage(reduced.valid(), who(), "the communication hook returned an empty CommFuture for bucket ", k,
              "; return the future of the reduced bucket (CommFuture::ready(tensor) if it is done)");
  return reduced;
}

// The built-in hook, c10d's _AllReduceBySumCommHook: the bucket, divided by
// the world size on its way in (copy_grad_to_bucket), summed over ranks. A
// group of one has nothing to send. (It needs no GradBucket: nothing but the
// reducer sees it.)
CommFuture Reducer::Impl::allreduce_by_sum(const at::Tensor& bucket) {
  at::Tensor buffer = bucket;
  if (pg->size() == 1) return CommFuture::ready(buffer);
  return CommFuture(pg->allreduce(buffer), buffer);
}

// The end of a static graph's first backward, as PyTorch's
// delay_all_reduce: which parameters any rank used is all-reduced once;
// every gradient goes into its bucket and every bucket is reduced, in order.
void Reducer::Impl::reduce_after_first_static_backward() {
  usage.end_first_iteration();
  usage.launch_used_map(*pg);
  for (size_t i = 0; i < params.size(); ++i) {
    marked[i] = 1;
    copy_grad_to_bucket(i, buckets.view_of(i));
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    buckets[k].pending = 0;
    observers.each([k](auto& o) { o.bucket_ready(k); });
  }
  launch_ready_buckets(/*may_skip=*/false);  // as PyTorch's delay_all_reduce: every bucket
}

// ---- 4. backward ends: wait, and the averages go to .grad ---------------

void Reducer::Impl::end_of_graph_task(const void* task) {
  std::lock_guard<std::mutex> lock(mutex);
  const auto ended = graph_tasks.end(task);
  if (!ended.armed || !expect_hooks) return;
  const bool all_marked = std::all_of(marked.begin(), marked.end(), [](char m) { return m != 0; });
  if (all_marked || (ended.outer && ended.none_left)) finalize_backward();
  // Otherwise a reentrant backward ended inside the outer one, whose hooks
  // and callback are still to come.
}

void Reducer::Impl::finalize_backward() {
  const auto backward_end = Clock::now();
  torch::NoGradGuard no_grad;
  const int64_t unused_bytes = mark_unused_ready();
  if (!check_every_bucket_launched()) return;

  const auto wait_start = Clock::now();
  const auto wait_end = wait_for_buckets();
  copy_results_to_grads();

  stats.iterations++;
  observers.each([this](auto& o) { o.step_counted(stats.iterations); });
  const bool communicated = skipped.size() < buckets.size() && (pg->size() > 1 || hook_registered());
  int64_t skipped_bytes = 0;
  for (size_t k : skipped) skipped_bytes += buckets[k].bytes();
  const detail::StepEnd end{backward_end, wait_start,     wait_end,     unused_bytes,
                            communicated, skipped.size(), skipped_bytes, &step_ready_order};
  observers.each([&end](auto& o) { o.step_finished(end); });

  // Every rank that finishes its first synchronised backward (a static
  // graph's second) rebuilds before its next forward, so all take part in
  // the broadcast.
  if (should_rebuild() && !usage.static_first_iteration()) rebuild_pending = true;
  if (usage.static_after_first_iteration() && should_rebuild())
    ready_order.insert(ready_order.end(), usage.unused().begin(), usage.unused().end());
  reset_iteration();
  const double step_ms = stats.backward_ms + stats.exposed_comm_ms;
  const bool settled = !should_rebuild() && !rebuild_pending;
  observers.each([&](auto& o) { o.between_steps(step_ms, settled); });
}

// The parameters that got no gradient are marked ready now (zeros), and
// their bytes counted for the logging data.
int64_t Reducer::Impl::mark_unused_ready() {
  auto bytes_of = [&](size_t i) { return params[i].numel() * params[i].element_size(); };
  int64_t unused = 0;
  if (usage.static_first_iteration()) {
    reduce_after_first_static_backward();
  } else if (usage.dynamic()) {
    for (size_t u : usage.unused()) unused += bytes_of(u);
    // Parameters in the graph whose hook never fired (an output left out of
    // the loss) count as unused too. PyTorch's DDP passes every output
    // through its _DDPSink, so their hooks fire there, and such a parameter
    // counts as used where its .grad is defined: the same here.
    unused_marked = true;
    for (size_t i = 0; i < params.size(); ++i)
      if (!marked[i]) {
        unused += bytes_of(i);
        usage.note_hook(i, params[i].grad().defined());
        mark_ready(i);
      }
  } else if (options.static_graph()) {
    for (size_t u : usage.unused()) unused += bytes_of(u);
  }
  return unused;
}

Clock::time_point Reducer::Impl::wait_for_buckets() {
  observers.each([](auto& o) { o.wait_started(); });
  struct Ended {  // the observers hear of a wait that threw too
    detail::Observers& observers;
    bool completed = false;
    ~Ended() {
      if (!completed) observers.each([](auto& o) { o.wait_ended(false); });
    }
  } ended{observers};
  for (size_t k = 0; k < buckets.size(); ++k) {
    auto& b = buckets[k];
    if (std::find(skipped.begin(), skipped.end(), k) != skipped.end()) continue;
    observers.each([&](auto& o) { o.waiting_for(stats.iterations, k, next_bucket); });
    if (b.reduced.valid()) take_hook_result(k, b.reduced.wait());
    observers.each([&](auto& o) { o.bucket_done(k, b); });
  }
  observers.each([&](auto& o) { o.waiting_for(stats.iterations, buckets.size(), next_bucket); });
  usage.wait_used_map();
  const auto end = Clock::now();
  ended.completed = true;
  observers.each([](auto& o) { o.wait_ended(true); });
  return end;
}

// The hook's reduced bucket goes into the bucket's own tensor, where the
// built-in hook leaves it already (PyTorch points its output views at the
// result instead; the values the gradients get are the same, a float16
// result included: widening to float32 is exact).
void Reducer::Impl::take_hook_result(size_t index, const at::Tensor& result) {
  auto& b = buckets[index];
  check_usage(result.defined() && result.numel() == b.contents.numel(), who(),
              "the communication hook's result for bucket ", index, " has ", result.defined() ? result.numel() : 0,
              " elements, the bucket ", b.contents.numel(),
              "; return a tensor of the bucket's size (the reduced bucket.buffer())");
  if (result.data_ptr() == b.contents.data_ptr() && result.scalar_type() == b.contents.scalar_type()) return;
  b.contents.copy_(result.reshape({-1}));
}

// copy_results_to_grads(): gradient_copies.cpp.

// ---- when a backward does not finish ------------------------------------

// Waits for every bucket launched this iteration, whatever happens to the
// others; the first failure's message, or empty.
std::string Reducer::Impl::wait_for_launched_buckets() {
  std::string failure;
  for (size_t b = 0; b < next_bucket; ++b) {
    try {
      if (buckets[b].reduced.valid()) buckets[b].reduced.wait();
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  return failure;
}

// Collectives this rank launched in an iteration that did not finish
// (backward threw) must end before their buckets are touched again.
void Reducer::Impl::settle_unfinished() {
  if (!expect_hooks) return;
  const size_t launched = next_bucket;
  std::string failure = wait_for_launched_buckets();
  try {
    usage.wait_used_map();
  } catch (const std::exception& e) {
    if (failure.empty()) failure = e.what();
  }
  if (launched > 0 || std::any_of(marked.begin(), marked.end(), [](char m) { return m != 0; })) {
    std::cerr << who() << "the previous backward did not finish (" << launched << " of " << buckets.size()
              << " bucket reductions had started; they were waited for). Ranks whose backward finished wait for "
                 "the rest and fail within the process group's timeout."
              << (failure.empty() ? "" : " The wait failed: " + failure) << std::endl;
  }
  reset_iteration();
}

void Reducer::Impl::reset_iteration() {
  std::fill(marked.begin(), marked.end(), 0);
  std::fill(kept_in_grad.begin(), kept_in_grad.end(), 0);
  buckets.reset();
  usage.reset_iteration();
  next_bucket = 0;
  skipped.clear();
  divisor.reset();
  expect_hooks = false;
  unused_marked = false;
  backward_started = false;
  step_ready_order.clear();
  graph_tasks.clear();
}

// ---- between steps: the bucket layout -----------------------------------

void Reducer::Impl::lay_out(const detail::Assignment& assignment) {
  if (buckets.adopt(params, assignment, options.gradient_as_bucket_view()))
    observers.each([this](auto& o) { o.buckets_laid_out(buckets); });
}

detail::Assignment Reducer::Impl::layout_for(double cap_mb) const {
  const auto limits = bucket_limits_in_effect(options, cap_mb);
  return layout_order.empty() ? initial_bucket_assignment(params, limits, true)
                              : compute_bucket_assignment(params, layout_order, limits);
}

// Before a forward (a joined rank's shadow of one too): the buckets follow
// the ready order every rank agreed on (rank 0's), then the cap the bucket
// size search asks for.
void Reducer::Impl::rebuild_and_apply_cap() {
  if (rebuild_pending) {
    rebuild_pending = false;
    auto agreed = detail::agree_on_ready_order(*pg, ready_order, params.size());
    rebuilt = true;
    ready_order.clear();
    if (agreed) {
      layout_order = std::move(*agreed);
      lay_out(compute_bucket_assignment(params, layout_order, bucket_limits_in_effect(options, options.bucket_cap_mb())));
      stats.buckets_rebuilt = true;
    }
  }
  if (cap_search) {
    if (const double cap = cap_search->take_pending_cap(); cap > 0) {
      lay_out(layout_for(cap));
      stats.bucket_cap_mb = cap;
    }
  }
}

// ---- the public Reducer -------------------------------------------------

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> pg,
                 const DDPOptions& options) {
  TORCH_CHECK(params.size() == names.size(), "Reducer: one name per parameter");
  TORCH_CHECK(!params.empty(), "Reducer: no parameters");
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    check_usage(!params[i].is_sparse(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '", names[i],
                "' is sparse; only dense parameters are supported");
    check_usage(seen.insert(params[i].unsafeGetTensorImpl()).second, "rank ", pg->rank(),
                ": DistributedDataParallel: parameter '", names[i],
                "' is given twice; pass each shared tensor once (DistributedDataParallel deduplicates them)");
    // One device for the whole module, as PyTorch's DDP. A GPU group's
    // (nccl's) must be it; Gloo and our MPI group carry CPU and CUDA tensors.
    check_usage(params[i].device() == params[0].device(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '",
                names[i], "' is on ", params[i].device().str(), " but '", names[0], "' on ", params[0].device().str(),
                "; DistributedDataParallel takes a module on one device: move it there (model->to(device))");
  }
  check_usage(pg->device().is_cpu() || params[0].device() == pg->device(), "rank ", pg->rank(),
              ": DistributedDataParallel: parameter '", names[0], "' is on ", params[0].device().str(), " but the ",
              pg->backend_name(), " process group works on ", pg->device().str(),
              "; move the model there first (model->to(pg->device()))");
  impl_ = std::make_shared<Impl>(std::move(params), std::move(names), std::move(pg), options);
  auto& s = *impl_;
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
  s.observers.add(std::make_unique<detail::RuntimeFigures>(s.stats));
  if (const auto threshold = StallInspector::threshold_for(options.stall_check_seconds(), *s.pg);
      threshold.count() > 0 && s.pg->size() > 1) {
    static std::atomic<int> models{0};
    s.observers.add(
        std::make_unique<detail::StallWatch>(std::make_unique<StallInspector>(s.pg, threshold, models++), s.names));
  }
  if (options.bucket_cap_auto()) {
    auto search = std::make_unique<detail::BucketCapSearch>(
        s.options, *s.pg, s.stats, [&s](double cap) { return s.layout_for(cap); }, s.who());
    s.cap_search = search.get();
    s.observers.add(std::move(search));
  }
  s.register_hooks();
  // As PyTorch 1.13, a static graph starts with one bucket per dtype, as
  // when find_unused_parameters is off: its first iteration reduces after
  // backward anyway.
  // As PyTorch 2.x, a bucket_cap_mb_list shapes the first iteration's buckets too.
  s.buckets.lay_out(s.params,
                    initial_bucket_assignment(s.params, bucket_limits_in_effect(options, options.bucket_cap_mb()),
                                              (options.find_unused_parameters() && !options.static_graph()) ||
                                                  !options.bucket_cap_mb_list().empty()),
                    options.gradient_as_bucket_view());
  s.observers.each([&s](auto& o) { o.buckets_laid_out(s.buckets); });
}

Reducer::~Reducer() {
  // A program that ends after the backward that failed never saw the error.
  if (impl_ && !impl_->unfinished_reduction.empty() && !impl_->unfinished_raised)
    std::cerr << impl_->unfinished_reduction << "\n  (No forward came after that backward to raise this error.)"
              << std::endl;
}

void Reducer::abandon_iteration() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  if (s.expect_hooks) (void)s.wait_for_launched_buckets();  // failed or not, dropped
  s.unfinished_reduction.clear();
  s.unfinished_raised = false;
  s.inverse_world = at::native::wrapped_scalar_tensor(1.0 / s.pg->size());  // the new world's
  s.reset_iteration();
  s.ready_order.clear();
  for (const auto& bucket : s.buckets.assignment())
    s.ready_order.insert(s.ready_order.end(), bucket.begin(), bucket.end());
  s.rebuild_pending = true;
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  if (!s.unfinished_reduction.empty()) {
    s.unfinished_raised = true;
    throw UsageError(s.unfinished_reduction);
  }
  // A forward after a synchronised one whose backward has not begun is part
  // of the same iteration (two forwards, one backward: PyTorch 2.x's static
  // graphs allow it): a static graph's first iteration counts the gradients
  // of both.
  const bool same_iteration = s.expect_hooks && !s.backward_started;
  s.settle_unfinished();
  s.observers.each([](auto& o) { o.forward_started(); });
  if (s.sync && !same_iteration) s.usage.count_synchronised_forward();
  s.rebuild_and_apply_cap();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  s.settle_unfinished();
  if (!s.sync) return;
  s.observers.each([](auto& o) { o.backward_prepared(); });
  s.expect_hooks = true;
  ++s.generation;
  if (s.should_rebuild()) s.ready_order.clear();
  s.graph_tasks.expect_outputs(outputs);
  s.usage.prepare_backward(outputs, s.accumulators);
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
  check_usage(!s.hook_registered(), s.who(),
              "register_comm_hook or register_builtin_comm_hook can only be called once.");
  check_usage(s.generation == 0 && s.stats.iterations == 0, s.who(),
              "register_comm_hook must be called before the first forward and backward that synchronise gradients; "
              "register the hook right after constructing DistributedDataParallel.");
  s.comm_hook = std::move(hook);
}

bool Reducer::has_comm_hook() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->hook_registered();
}

void Reducer::set_timeline(std::shared_ptr<Timeline> timeline) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  // One recorder for the reducer's life: a timeline set again (or unset)
  // keeps the marks of the buckets already in flight.
  if (s.timeline) {
    s.timeline->set_timeline(std::move(timeline));
  } else if (timeline) {
    auto recorder = std::make_unique<detail::TimelineRecorder>(std::move(timeline), s.buckets);
    s.timeline = recorder.get();
    s.observers.add(std::move(recorder));
  }
}

void Reducer::set_forward_pass_work(CommFuture nonjoined, bool divide_by_nonjoined) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->divisor.set_forward_count(std::move(nonjoined), divide_by_nonjoined);
}

void Reducer::join_shadow_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->rebuild_and_apply_cap();
}

void Reducer::join_shadow_backward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->shadow_backward();
}

const ReducerStats& Reducer::stats() const { return impl_->stats; }

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->buckets.assignment();
}

}  // namespace ddp
