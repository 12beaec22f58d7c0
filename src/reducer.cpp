#include "ddp/reducer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_set>

namespace ddp {

using Clock = std::chrono::steady_clock;

std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order, int64_t first_cap,
                                                           int64_t cap) {
  struct Open {
    std::vector<size_t> vars;
    int64_t bytes = 0;
    bool first = true;  // this dtype/device has not closed a bucket yet
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> result;
  for (size_t i : order) {
    const auto& p = params.at(i);
    auto& bucket = open[{static_cast<int>(p.scalar_type()), p.device().str()}];
    bucket.vars.push_back(i);
    bucket.bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (bucket.bytes >= (bucket.first ? first_cap : cap)) {
      result.push_back(std::move(bucket.vars));
      bucket.vars.clear();
      bucket.bytes = 0;
      bucket.first = false;
    }
  }
  for (auto& [key, bucket] : open)
    if (!bucket.vars.empty()) result.push_back(std::move(bucket.vars));
  // Launch order: a bucket is ready when its last member is, and members are
  // listed in ready order, so order buckets by where their members start.
  std::vector<size_t> position(params.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  std::sort(result.begin(), result.end(),
            [&](const auto& a, const auto& b) { return position[a.front()] < position[b.front()]; });
  return result;
}

struct Reducer::Impl : std::enable_shared_from_this<Impl> {
  struct Slot {
    size_t bucket = 0;
    size_t index = 0;  // within the bucket
  };
  struct Bucket {
    at::Tensor contents;             // flat, one dtype
    std::vector<size_t> vars;        // parameter indices
    std::vector<at::Tensor> views;   // aliases of contents shaped like each parameter
    size_t pending = 0;              // gradients not yet ready this iteration
    Work work;
  };

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps our hooks alive across iterations

  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  size_t next_bucket = 0;  // buckets launch strictly in order, the same on every rank

  std::vector<char> marked;  // ready this iteration
  std::vector<char> used;    // got a real gradient this iteration (find_unused_parameters)
  std::vector<size_t> unused_from_graph;

  bool sync = true;
  bool expect_hooks = false;  // a DDP forward prepared this backward
  bool finalize_queued = false;
  bool record_order = true;   // during the first synchronised iteration
  bool rebuild_pending = false;
  std::vector<size_t> ready_order;
  Clock::time_point first_ready;

  ReducerStats stats;
  mutable std::mutex mutex;

  std::string who() const { return "rank " + std::to_string(pg->rank()) + ": DistributedDataParallel: "; }

  void register_hooks() {
    std::weak_ptr<Impl> weak = shared_from_this();
    for (size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i]);
      TORCH_CHECK(acc, who(), "parameter '", names[i], "' is not a leaf that requires grad");
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
  static at::Tensor alias(const at::Tensor& contents, int64_t offset, const at::Tensor& like) {
    std::vector<int64_t> strides(like.dim(), 1);
    for (int64_t d = like.dim() - 2; d >= 0; --d) strides[d] = strides[d + 1] * std::max<int64_t>(like.size(d + 1), 1);
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
        // Gradients that exist (a rebuild, or accumulation before the first
        // synchronised step) move into the bucket.
        auto& grad = p.mutable_grad();
        if (grad.defined()) {
          b.views.back().copy_(grad);
          if (options.gradient_as_bucket_view()) grad = b.views.back();
        }
      }
      b.pending = vars.size();
      buckets.push_back(std::move(b));
    }
    stats.num_buckets = buckets.size();
    stats.bucket_bytes.clear();
    for (const auto& b : buckets) stats.bucket_bytes.push_back(b.contents.numel() * b.contents.element_size());
  }

  std::vector<std::vector<size_t>> assignment_for(const std::vector<size_t>& order) const {
    auto mb = [](double v) { return static_cast<int64_t>(v * 1024 * 1024); };
    return compute_bucket_assignment(params, order, mb(options.first_bucket_mb()), mb(options.bucket_cap_mb()));
  }

  void autograd_hook(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!expect_hooks) return;  // no_sync, or a backward not prepared by a DDP forward
    if (!finalize_queued) {
      finalize_queued = true;
      first_ready = Clock::now();
      std::weak_ptr<Impl> weak = shared_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto self = weak.lock()) self->finalize_backward();
      });
      for (size_t u : unused_from_graph) mark_ready(u, false);
    }
    mark_ready(i, true);
  }

  void mark_ready(size_t i, bool has_grad) {
    if (marked[i]) {
      if (!has_grad) return;  // already marked unused from the graph, and then it was used after all
      TORCH_CHECK(false, who(), "parameter '", names[i],
                  "' was marked ready twice in one backward. Reentrant backward (activation checkpointing) "
                  "or using the module's output in two backward calls is not supported.");
    }
    marked[i] = 1;
    const auto& slot = slots[i];
    auto& bucket = buckets[slot.bucket];
    const auto& view = bucket.views[slot.index];
    auto& grad = params[i].mutable_grad();
    if (has_grad && grad.defined()) {
      used[i] = 1;
      if (record_order) ready_order.push_back(i);
      if (!is_alias(grad, view)) {
        view.copy_(grad);
        if (options.gradient_as_bucket_view()) grad = view;
      }
    } else {
      view.zero_();
    }
    if (--bucket.pending == 0) launch_ready_buckets();
  }

  void launch_ready_buckets() {
    const int world = pg->size();
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      auto& b = buckets[next_bucket++];
      if (world > 1) {
        // Averaging before summing, as PyTorch does: one pass over the bucket.
        b.contents.div_(world);
        b.work = pg->allreduce(b.contents);
      }
    }
  }

  void reset_iteration() {
    std::fill(marked.begin(), marked.end(), 0);
    std::fill(used.begin(), used.end(), 0);
    for (auto& b : buckets) {
      b.pending = b.vars.size();
      b.work = Work();
    }
    next_bucket = 0;
    expect_hooks = false;
    finalize_queued = false;
    unused_from_graph.clear();
  }

  void finalize_backward() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!expect_hooks) return;
    const auto backward_end = Clock::now();
    torch::NoGradGuard no_grad;
    if (options.find_unused_parameters())
      for (size_t i = 0; i < params.size(); ++i)
        if (!marked[i]) mark_ready(i, false);

    if (next_bucket < buckets.size()) {
      std::ostringstream missing;
      size_t count = 0;
      for (size_t i = 0; i < params.size(); ++i)
        if (!marked[i]) missing << (count++ ? ", " : "") << "'" << names[i] << "'";
      for (size_t b = 0; b < next_bucket; ++b) {
        try {
          buckets[b].work.wait();
        } catch (const std::exception&) {
        }
      }
      reset_iteration();
      TORCH_CHECK(false, who(), "backward finished, but ", count,
                  " parameter(s) received no gradient, so the gradient reduction could not finish: ",
                  missing.str(),
                  ".\n  Either make every parameter contribute to the loss, or construct with "
                  "ddp::DDPOptions().find_unused_parameters(true).");
    }

    at::Tensor globally_used;
    Work used_work;
    if (options.find_unused_parameters() && pg->size() > 1) {
      globally_used = torch::from_blob(used.data(), {static_cast<int64_t>(used.size())}, torch::kInt8)
                          .to(torch::TensorOptions().dtype(torch::kInt32).device(pg->device()));
      used_work = pg->allreduce(globally_used);
    }
    const auto wait_start = Clock::now();
    for (auto& b : buckets) b.work.wait();
    used_work.wait();
    const auto wait_end = Clock::now();
    std::vector<int32_t> used_anywhere;
    if (globally_used.defined()) {
      auto cpu = globally_used.cpu();
      used_anywhere.assign(cpu.data_ptr<int32_t>(), cpu.data_ptr<int32_t>() + cpu.numel());
    }

    const bool as_view = options.gradient_as_bucket_view();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& view = buckets[slots[i].bucket].views[slots[i].index];
      auto& grad = params[i].mutable_grad();
      if (used[i] || is_alias(grad, view)) {
        if (!as_view) grad.copy_(view);
        continue;
      }
      // Not used here: takes the average if some rank used it; a parameter no
      // rank used keeps an undefined gradient, so optimizers skip it (as PyTorch).
      bool used_elsewhere = used_anywhere.empty() ? pg->size() > 1 : used_anywhere[i] > 0;
      if (used_elsewhere || grad.defined()) grad = as_view ? view : view.clone();
    }

    stats.iterations++;
    stats.bytes_reduced = 0;
    for (const auto& b : buckets) stats.bytes_reduced += b.contents.numel() * b.contents.element_size();
    stats.backward_ms = std::chrono::duration<double, std::milli>(backward_end - first_ready).count();
    stats.exposed_comm_ms = std::chrono::duration<double, std::milli>(wait_end - wait_start).count();

    if (record_order) {
      record_order = false;
      // As PyTorch: buckets follow the real ready order from the second
      // iteration on, unless the graph may change between iterations.
      rebuild_pending = !options.find_unused_parameters() && ready_order.size() == params.size();
    }
    reset_iteration();
  }

  void rebuild_buckets() {
    // Every rank adopts rank 0's order, so buckets (and collectives) match.
    auto order = torch::tensor(std::vector<int64_t>(ready_order.begin(), ready_order.end()), torch::kInt64)
                     .to(pg->device());
    if (pg->size() > 1) pg->broadcast(order, 0).wait();
    auto cpu = order.cpu();
    std::vector<size_t> agreed(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
    auto assignment = assignment_for(agreed);
    // Often the real order packs the same buckets as the guess (a plain stack
    // of layers): then reallocating would only cost a bucket's worth of peak
    // memory and a copy of every gradient. Every rank sees the same order and
    // the same buckets, so all of them decide alike.
    bool same = assignment.size() == buckets.size();
    for (size_t b = 0; same && b < buckets.size(); ++b) same = assignment[b] == buckets[b].vars;
    if (!same) initialize_buckets(assignment);
    stats.buckets_rebuilt = true;
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
  TORCH_CHECK(options.bucket_cap_mb() > 0 && options.first_bucket_mb() > 0,
              "DDPOptions: bucket_cap_mb and first_bucket_mb must be positive");
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(!params[i].is_sparse(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '", names[i],
                "' is sparse; only dense parameters are supported");
    TORCH_CHECK(params[i].device() == pg->device(), "rank ", pg->rank(), ": DistributedDataParallel: parameter '",
                names[i], "' is on ", params[i].device().str(), " but the ", pg->backend_name(), " process group works on ",
                pg->device().str(), "; move the model there first (model->to(pg->device()))");
  }
  auto& s = *impl_;
  s.params = std::move(params);
  s.names = std::move(names);
  s.pg = std::move(pg);
  s.options = options;
  s.marked.assign(s.params.size(), 0);
  s.used.assign(s.params.size(), 0);
  s.register_hooks();
  // Until the real order is known: gradients arrive roughly in reverse
  // registration order (the last layer's first).
  std::vector<size_t> order(s.params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  s.initialize_buckets(s.assignment_for(order));
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->rebuild_pending) {
    impl_->rebuild_pending = false;
    impl_->rebuild_buckets();
  }
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& s = *impl_;
  if (!s.sync) {
    s.expect_hooks = false;
    return;
  }
  if (s.finalize_queued) s.reset_iteration();  // a backward that never finished (an exception inside it)
  s.expect_hooks = true;
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

const ReducerStats& Reducer::stats() const { return impl_->stats; }

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::vector<size_t>> out;
  for (const auto& b : impl_->buckets) out.push_back(b.vars);
  return out;
}

}  // namespace ddp
