#include "ddp/parallel/distributed_data_parallel.h"

#include "parallel/ddp_internals.h"

#include "ddp/comm/recovery.h"
#include "ddp/runtime/malloc_tuning.h"
#include "comm/objects/object_exchange.h"
#include "comm/group/registry.h"
#include "parallel/tied_weights.h"
#include "runtime/parse_number.h"
#include "usage_check.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <unordered_set>
#include <sstream>

namespace ddp {
namespace {

// A model whose largest gradient has at least this many MiB has "large
// gradients": what glibc's heap keeps of their gradient-sized temporaries
// shows in RSS, so the automatic malloc thresholds apply to it and its
// step's heap is not retained. Below it, that is noise, and activations of
// that size are better reused from the heap.
constexpr double kLargeGradientMb = 4.0;

// Each tensor once, under the first name it has, in LibTorch's order (the
// module first, then its children depth-first: Python's named_modules()
// order). A weight registered twice (tied embeddings, a layer applied twice)
// is one parameter, as in PyTorch.
std::vector<std::pair<std::string, at::Tensor>> unique_named(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  std::unordered_set<const void*> seen;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : dict)
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  return out;
}

// Sparse gradients would need a bucket of their own and a sparse all-reduce;
// refuse them where the user can still change the model.
void refuse_sparse_gradients(const torch::nn::Module& module, const std::unordered_set<std::string>& ignore, int rank) {
  for (const auto& m : module.named_modules("", /*include_self=*/true)) {
    bool sparse = false;
    if (const auto* e = m.value()->as<torch::nn::Embedding>()) sparse = e->options.sparse();
    if (const auto* e = m.value()->as<torch::nn::EmbeddingBag>()) sparse = e->options.sparse();
    if (!sparse) continue;
    for (const auto& p : m.value()->named_parameters(false)) {
      const std::string name = m.key().empty() ? p.key() : m.key() + "." + p.key();
      check_usage(!p.value().requires_grad() || ignore.count(name), "rank ", rank, ": DistributedDataParallel: parameter '", name,
                  "' gets sparse gradients (its embedding was made with sparse(true)); libddp reduces dense "
                  "gradients only. Construct the embedding with sparse(false), or freeze it.");
    }
  }
}

std::string describe(const std::string& kind, const std::string& name, const at::Tensor& t) {
  std::ostringstream s;
  s << kind << " '" << name << "' " << t.sizes() << " " << t.dtype();
  // A different layout makes a different bucket view, and a frozen layer
  // different buckets: both must agree across ranks.
  if (!t.is_contiguous()) s << " strides " << t.strides();
  if (kind == "parameter") s << (t.requires_grad() ? " requires_grad" : " frozen");
  return s.str();
}

using NameSet = std::unordered_set<std::string>;

std::vector<std::string> signature(const torch::nn::Module& module, const NameSet& ignore) {
  std::vector<std::string> lines;
  for (const auto& p : unique_named(module.named_parameters(true)))
    if (!ignore.count(p.first)) lines.push_back(describe("parameter", p.first, p.second));
  for (const auto& b : unique_named(module.named_buffers(true)))
    if (!ignore.count(b.first)) lines.push_back(describe("buffer", b.first, b.second));
  return lines;
}

// The module's buffers, each once, but the ignored ones.
std::vector<at::Tensor> buffers_of(const torch::nn::Module& module, const NameSet& ignore) {
  std::vector<at::Tensor> buffers;
  for (const auto& [name, b] : unique_named(module.named_buffers(true)))
    if (!ignore.count(name)) buffers.push_back(b);
  return buffers;
}

// The buffers' broadcast before a forward, their autograd version counters
// left as they were (as PyTorch since 2.12): an earlier forward of the same
// iteration saved a BatchNorm's running statistics for its backward, which
// a bumped counter would fail ("modified by an inplace operation") although
// a training BatchNorm's backward does not read them: two forwards and one
// backward (a GAN's discriminator on fake and real) work as without DDP.
void sync_buffers(ProcessGroup& pg, const std::vector<at::Tensor>& buffers, int root) {
  std::vector<std::pair<c10::TensorImpl*, c10::VariableVersion>> saved;
  for (const auto& b : buffers) {
    if (b.is_inference()) continue;  // no counter to keep
    auto* impl = b.unsafeGetTensorImpl();
    saved.emplace_back(impl, impl->version_counter());
    impl->set_version_counter(c10::VariableVersion(saved.back().second.current_version()));
  }
  auto restore = [&] {
    for (auto& [impl, counter] : saved) impl->set_version_counter(std::move(counter));
  };
  try {
    broadcast_coalesced(pg, buffers, root);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

// params_and_buffers_to_ignore as a set; a name that matches nothing is
// warned about, as it is most likely misspelt (PyTorch says nothing).
NameSet ignored_names(const torch::nn::Module& module, const std::vector<std::string>& names, int rank) {
  NameSet ignore(names.begin(), names.end());
  const auto params = module.named_parameters(true), buffers = module.named_buffers(true);
  for (const auto& name : ignore) {
    if (!params.contains(name) && !buffers.contains(name))
      TORCH_WARN("rank ", rank, ": DistributedDataParallel: params_and_buffers_to_ignore names '", name,
                 "', which is no parameter or buffer of the module (named_parameters() and named_buffers() give "
                 "the names, as \"fc2.weight\")");
  }
  return ignore;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The largest of these tensors, in MiB.
double largest_megabytes(const std::vector<at::Tensor>& tensors) {
  int64_t largest = 0;
  for (const auto& t : tensors) largest = std::max<int64_t>(largest, static_cast<int64_t>(t.nbytes()));
  return static_cast<double>(largest) / (1024.0 * 1024.0);
}

// DDPOptions::malloc_mmap_threshold_mb resolved for these parameters: the
// automatic choice puts every gradient-sized temporary above the threshold.
// DDP_MALLOC_MMAP_THRESHOLD_MB in the environment overrides the option, so
// that a job can be tuned without a rebuild.
double malloc_threshold_for(const std::vector<at::Tensor>& params, double requested_mb, int rank) {
  if (const char* env = std::getenv("DDP_MALLOC_MMAP_THRESHOLD_MB")) {
    const auto v = parse_number(env);
    check_usage(v.has_value(), "rank ", rank,
                ": DistributedDataParallel: DDP_MALLOC_MMAP_THRESHOLD_MB='", env,
                "' is not a number; give MiB (4), 0 to leave malloc alone, or -1 for the automatic choice");
    requested_mb = *v;
  }
  if (requested_mb >= 0) return requested_mb;
  const double mb = largest_megabytes(params);
  return mb >= kLargeGradientMb ? mb : 0.0;
}

}  // namespace

void verify_same_model(const torch::nn::Module& module, ProcessGroup& pg, const std::vector<std::string>& ignore) {
  if (pg.size() == 1) return;
  const auto mine = signature(module, NameSet(ignore.begin(), ignore.end()));
  const std::string text = join(mine);
  // 63 bits of the signature's hash, so that it fits a signed int64 tensor.
  const int64_t hash = static_cast<int64_t>(std::hash<std::string>{}(text) >> 1);
  auto hashes = pg.allgather(torch::tensor({hash}, torch::kInt64).to(pg.device()));
  std::vector<int> differ;
  for (int r = 0; r < pg.size(); ++r)
    if (hashes[r].item<int64_t>() != hashes[0].item<int64_t>()) differ.push_back(r);
  if (differ.empty()) return;

  // Everyone knows now: fetch rank 0's signature to say exactly what differs.
  const auto theirs = split(detail::broadcast_bytes(pg, text, 0));

  std::ostringstream msg;
  msg << "rank " << pg.rank() << ": DistributedDataParallel: the model is not the same on every rank; ranks";
  for (int r : differ) msg << " " << r;
  msg << " differ from rank 0.";
  if (pg.rank() != 0 && std::find(differ.begin(), differ.end(), pg.rank()) != differ.end()) {
    if (mine.size() != theirs.size())
      msg << " This rank has " << mine.size() << " parameters and buffers, rank 0 has " << theirs.size() << ".";
    for (size_t i = 0; i < std::min(mine.size(), theirs.size()); ++i) {
      if (mine[i] != theirs[i]) {
        msg << " First difference: here " << mine[i] << ", on rank 0 " << theirs[i] << ".";
        break;
      }
    }
  }
  msg << "\n  Build the same model (same layers, shapes and dtypes) on every rank before wrapping it.";
  throw UsageError(msg.str());
}

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root) {
  if (pg.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  // One flat tensor per dtype: a few large messages instead of many small ones.
  std::map<int, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) groups[static_cast<int>(t.scalar_type())].push_back(t);
  std::vector<std::pair<at::Tensor, std::vector<at::Tensor>*>> flats;
  std::vector<Work> works;
  for (auto& [dtype, group] : groups) {
    std::vector<at::Tensor> pieces;
    for (const auto& t : group) pieces.push_back(t.reshape({-1}));
    auto flat = torch::cat(pieces);
    works.push_back(pg.broadcast(flat, root));
    flats.emplace_back(flat, &group);
  }
  for (auto& w : works) w.wait();
  for (auto& [flat, group] : flats) {
    int64_t offset = 0;
    for (auto& t : *group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

namespace {

// The job's timeline gathered and written (collective; once: a second call
// does nothing), or this rank's part where gathering fails.
void write_timeline(Timeline& timeline, int rank) noexcept {
  try {
    timeline.write();
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": writing the DDP timeline failed: " << e.what() << std::endl;
    timeline.write_own_part();
  }
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         std::shared_ptr<ProcessGroup> pg,
                                                         DistributedDataParallelOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options), internals_(std::make_unique<Internals>()) {
  check_usage(module_ != nullptr, "DistributedDataParallel: the module is null");
  check_usage(pg_ != nullptr, "DistributedDataParallel: the process group is null; call ddp::init_process_group() first");
  Internals& d = *internals_;
  d.ignored = ignored_names(*module_, options_.params_and_buffers_to_ignore(), pg_->rank());
  const NameSet& ignore = d.ignored;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : unique_named(module_->named_parameters(true))) {
    if (ignore.count(name)) continue;
    d.state.push_back(p);
    if (p.requires_grad()) {
      params.push_back(p);
      names.push_back(name);
    }
  }
  check_usage(!params.empty(), "rank ", pg_->rank(),
              ": DistributedDataParallel: the module has no parameter that requires a gradient; it needs no DDP");
  refuse_sparse_gradients(*module_, ignore, pg_->rank());
  check_usage(options_.bucket_cap_mb_list().empty() || !options_.first_bucket_mb_given(), "rank ", pg_->rank(),
              ": DistributedDataParallel: first_bucket_mb and bucket_cap_mb_list both give the first bucket's cap; "
              "give one (the list's first entry is the first bucket's)");
  d.buffers = buffers_of(*module_, ignore);
  d.state.insert(d.state.end(), d.buffers.begin(), d.buffers.end());

  const bool reducer_params_are_cpu = params.front().is_cpu();
  if (reducer_params_are_cpu) {
    fix_malloc_thresholds(malloc_threshold_for(params, options_.malloc_mmap_threshold_mb(), pg_->rank()));
  }
  // A rank that joins a running recoverable group is not in it yet: the
  // others wrapped their models long ago, and it takes their state when
  // taken in (RecoverableGroup::set_state).
  const auto* recoverable = dynamic_cast<const RecoverableGroup*>(pg_.get());
  if (!recoverable || !recoverable->joining()) {
    verify_same_model(*module_, *pg_, options_.params_and_buffers_to_ignore());
    broadcast_coalesced(*pg_, d.state, 0);
  }
  // Models with large gradients are left alone: the heap would keep the holes
  // their gradient-sized temporaries leave (docs/performance.md, "Where the
  // memory goes"), and their steps are long enough not to notice the faults.
  d.step_memory_pending = options_.retain_step_memory() && reducer_params_are_cpu &&
                          largest_megabytes(params) < kLargeGradientMb;
  const std::vector<at::Tensor> reduced = params;
  d.reducer = std::make_unique<Reducer>(std::move(params), std::move(names), pg_, options_);
  // A parameter without a gradient: the error names the cause when the module shows it.
  d.reducer->set_no_gradient_advice([weak = std::weak_ptr<torch::nn::Module>(module_)](const auto& missing) {
    const auto module = weak.lock();
    return module ? detail::no_gradient_advice(*module, missing) : std::string();
  });
  detail::warn_about_tied_weights(*module_, pg_->rank());
  d.logging_data = detail::construction_logging_data(*module_, *pg_, options_, reduced, d.reducer->stats());
  start_timeline();
}

// The job's timeline when DDP_TIMELINE asks for one, fed by the reducer.
void DistributedDataParallelBase::start_timeline() {
  // The timeline's agreement, offsets and gathers are collectives over a
  // fixed world: a recoverable group changes its own (docs/observe.md).
  if (auto* recoverable = dynamic_cast<const RecoverableGroup*>(pg_.get())) {
    if (std::getenv("DDP_TIMELINE") && recoverable->slot() == 0)
      std::cerr << "libddp: DDP_TIMELINE is ignored on a recoverable group (in-process recovery)" << std::endl;
    return;
  }
  timeline_ = timeline_from_env(pg_);
  if (!timeline_) return;
  internals_->reducer->set_timeline(timeline_);
  // Gathering the timeline is collective: when the group shuts down
  // (destroy_process_group(), or the program's exit) with this DDP still
  // alive, it is written then, while every rank still has the group.
  auto write = [weak = std::weak_ptr<Timeline>(timeline_), rank = pg_->rank()] {
    if (auto timeline = weak.lock()) write_timeline(*timeline, rank);
  };
  detail::GroupRegistry::instance().before_shutdown(pg_, write);
}

DistributedDataParallelBase::~DistributedDataParallelBase() {
  if (!timeline_) return;
  internals_->reducer->set_timeline(nullptr);
  // Gathering is collective: while an exception unwinds, the other ranks may
  // not come, so this rank keeps its own part instead.
  if (std::uncaught_exceptions() > 0) {
    timeline_->write_own_part();
    return;
  }
  write_timeline(*timeline_, pg_->rank());
}

const ReducerStats& DistributedDataParallelBase::stats() const { return internals_->reducer->stats(); }

void DistributedDataParallelBase::install_comm_hook(CommHook hook) {
  internals_->reducer->register_comm_hook(std::move(hook));
}

DistributedDataParallelBase::NoSyncGuard::NoSyncGuard(DistributedDataParallelBase& ddp)
    : ddp_(&ddp), previous_(ddp.internals_->reducer->sync()) {
  ddp.internals_->reducer->set_sync(false);
}

DistributedDataParallelBase::NoSyncGuard::~NoSyncGuard() {
  if (ddp_) ddp_->internals_->reducer->set_sync(previous_);
}

namespace {

// The highest rank among the candidates, agreed by all (PyTorch's
// _find_common_rank, a MAX all-reduce; our group sums only, so an allgather).
int find_common_rank(ProcessGroup& pg, bool candidate) {
  auto mine = torch::full({1}, candidate ? pg.rank() : -1,
                          torch::TensorOptions().dtype(torch::kInt64).device(pg.device()));
  int64_t common = -1;
  for (const auto& t : pg.allgather(mine)) common = std::max(common, t.item<int64_t>());
  if (common < 0 && dynamic_cast<RecoverableGroup*>(&pg))
    throw StateLost("rank " + std::to_string(pg.rank()) + ": ddp::Join: every rank that trained to the end was "
                    "lost, and the ranks left hold older models; the run cannot go on exactly: restart it from its "
                    "last checkpoint");
  TORCH_CHECK(common >= 0, "rank ", pg.rank(),
              ": ddp::Join: no rank was a candidate for the common rank; a bug in libddp");
  return static_cast<int>(common);
}

// The group re-formed after a fault: the failed step's reductions are
// dropped, the buckets follow the new rank 0's order, and the buffers (each
// rank's forward updated its own) come from it. Before a forward, or a
// joined rank's shadow of one.
void follow_regroup(DistributedDataParallelBase::Internals& d, ProcessGroup& pg) {
  auto* recoverable = dynamic_cast<RecoverableGroup*>(&pg);
  if (!recoverable || recoverable->generation() == d.group_generation) return;
  d.group_generation = recoverable->generation();
  d.reducer->abandon_iteration();
  d.join_sync_work = Work();
  d.require_forward_param_sync = true;
}

}  // namespace

void DistributedDataParallelBase::pre_forward() {
  Internals& d = *internals_;
  follow_regroup(d, *pg_);
  const bool builds_graph = torch::GradMode::is_enabled();
  const bool joined_up = join_config().enable;
  // Under ddp::Join a forward without a graph (evaluation under
  // NoGradGuard) runs no collective: PyTorch's would desynchronise the joined
  // ranks, which shadow training iterations only (docs/design.md).
  if (!builds_graph && joined_up) return;
  if (timeline_ && builds_graph) d.forward_start_us = timeline_->now_us();
  // PyTorch's order: under ddp::Join, count the ranks still training; the
  // rebuild; buffers from rank 0 (the highest rank still training under
  // Join); whether backward synchronises. Joined ranks answer each
  // (DDPJoinHook::main_hook).
  // Outside Join this clears the last Join's count, so it cannot divide later backwards.
  d.reducer->set_forward_pass_work(Join::notify_join_context(*this), joined_up && !d.divide_by_initial_world_size);
  if (builds_graph) d.reducer->prepare_for_forward();
  // As PyTorch (require_forward_param_sync): buffers follow rank 0 before a
  // forward whose previous forward built a graph and synchronised, so once
  // per gradient-accumulation cycle, and once at the first evaluation after
  // training: every rank evaluates with rank 0's running statistics. A
  // forward that builds no graph leaves the next one without a broadcast, so
  // an evaluation of many batches broadcasts once. To evaluate on rank 0
  // alone, call the module (model.module()->forward), not the wrapper: the
  // wrapper's broadcast would wait for the other ranks (docs/api.md).
  if (options_.broadcast_buffers() && d.require_forward_param_sync) {
    d.buffers = buffers_of(*module_, d.ignored);
    if (!d.buffers.empty()) sync_buffers(*pg_, d.buffers, joined_up ? find_common_rank(*pg_, true) : 0);
  }
  if (joined_up) {
    auto requires_sync =
        torch::full({1}, d.reducer->sync() ? 1.0f : 0.0f, torch::TensorOptions().device(pg_->device()));
    d.join_sync_work = pg_->allreduce(requires_sync);
  }
  if (builds_graph && d.step_memory_pending) d.bytes_before_first_forward = malloc_bytes_in_use();
}

void DistributedDataParallelBase::post_forward(const std::vector<at::Tensor>& outputs) {
  Internals& d = *internals_;
  d.join_sync_work.wait();
  d.join_sync_work = Work();
  if (!torch::GradMode::is_enabled()) {
    if (!join_config().enable) d.require_forward_param_sync = false;
    return;
  }
  if (timeline_) timeline_->span(Timeline::Row::compute, "forward", d.forward_start_us, timeline_->now_us());
  d.require_forward_param_sync = d.reducer->sync();
  if (d.step_memory_pending) {
    // The forward's activations are all alive now: what they take tells
    // whether the step is small enough for glibc to keep
    // (ddp/runtime/malloc_tuning.h says why it needs to be told).
    d.step_memory_pending = false;
    const std::size_t now = malloc_bytes_in_use();
    if (now > d.bytes_before_first_forward) retain_step_memory(now - d.bytes_before_first_forward);
  }
  d.reducer->prepare_for_backward(outputs);
}

// ---- ddp::Join ----------------------------------------------------------------

namespace {

// As PyTorch's _DDPJoinHook.
class DDPJoinHook : public JoinHook {
 public:
  DDPJoinHook(DistributedDataParallelBase& ddp, const torch::nn::Module& module, ProcessGroup& pg)
      : ddp_(ddp), module_(module), d_(internals_of(ddp)), pg_(pg) {}

  // One iteration of the ranks still training, as this rank's collectives.
  void main_hook() override {
    follow_regroup(d_, pg_);
    d_.reducer->join_shadow_forward();
    if (ddp_.options().broadcast_buffers() && d_.require_forward_param_sync) {
      d_.buffers = buffers_of(module_, d_.ignored);
      if (!d_.buffers.empty()) broadcast_coalesced(pg_, d_.buffers, find_common_rank(pg_, false));
    }
    auto requires_sync = torch::zeros({1}, torch::TensorOptions().device(pg_.device()));
    pg_.allreduce(requires_sync).wait();
    const bool should_sync = requires_sync.item<float>() != 0;
    // A forward that skips sync (no_sync) skips the next buffer broadcast too.
    d_.require_forward_param_sync = should_sync;
    if (should_sync) d_.reducer->join_shadow_backward();
  }

  // Every rank takes the model of the highest rank among the last to finish.
  void post_hook(bool is_last_joiner) override {
    broadcast_coalesced(pg_, d_.state, find_common_rank(pg_, is_last_joiner));
  }

 private:
  DistributedDataParallelBase& ddp_;
  const torch::nn::Module& module_;
  DistributedDataParallelBase::Internals& d_;
  ProcessGroup& pg_;
};

}  // namespace

std::unique_ptr<JoinHook> DistributedDataParallelBase::join_hook(const JoinOptions& options) {
  internals_->joined_up = true;
  internals_->divide_by_initial_world_size = options.divide_by_initial_world_size();
  return std::make_unique<DDPJoinHook>(*this, *module_, *pg_);
}

}  // namespace ddp
