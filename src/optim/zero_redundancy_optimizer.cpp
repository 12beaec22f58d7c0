#include "ddp/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "comm/objects/object_exchange.h"
#include "ddp/comm/recovery.h"
#include "optim/zero_state.h"
#include "usage_check.h"

namespace ddp {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;

std::string describe_param(const torch::Tensor& p) {
  std::ostringstream s;
  s << p.sizes() << " " << p.scalar_type();
  return s.str();
}

// Checks what one rank can check alone: before the base class sees the
// groups (it would TORCH_CHECK a non-leaf tensor).
std::vector<OptimizerParamGroup> checked(std::vector<OptimizerParamGroup> groups, const ProcessGroup* pg) {
  check_usage(pg != nullptr, "ZeroRedundancyOptimizer: the process group is null; call ddp::init_process_group() first");
  const std::string who = "ZeroRedundancyOptimizer on " + rank_tag(*pg) + ": ";
  std::set<const void*> seen;
  size_t count = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto& p = groups[g].params()[i];
      const std::string where = "parameter " + std::to_string(i) + " of group " + std::to_string(g);
      check_usage(p.defined(), who, where, " is undefined");
      check_usage(p.is_leaf(), who, where, " is not a leaf tensor; pass the module's parameters()");
      check_usage(p.layout() == torch::kStrided, who, where, " is sparse; ZeRO shards dense parameters only");
      check_usage(seen.insert(p.unsafeGetTensorImpl()).second, who, where,
                  " appears more than once; pass each parameter once");
      ++count;
    }
  }
  check_usage(count > 0, who, "no parameters to optimize");
  // One device for every parameter: small ones travel coalesced into flat tensors.
  std::optional<torch::Device> device;
  for (const auto& g : groups)
    for (const auto& p : g.params()) {
      if (!device) device = p.device();
      check_usage(p.device() == *device, who, "parameters on ", device->str(), " and ", p.device().str(),
                  "; put the model on one device before wrapping its optimizer");
    }
  return groups;
}

// Collective (one all-gather): every rank's error building its optimizer
// (or "") and the signature of its parameters; every rank throws the first
// rank's error, or names the first rank whose parameters differ.
void check_same_everywhere(ProcessGroup& pg, const std::string& who, const std::string& error,
                           const std::string& signature) {
  const auto all = detail::all_gather_bytes(pg, (error.empty() ? "0" : "1" + error + "\x01") + signature);
  for (int r = 0; r < pg.size(); ++r) {
    if (all[r][0] == '1') {
      const auto end = all[r].find('\x01');
      throw UsageError(who + "rank " + std::to_string(r) + " could not build its optimizer: " + all[r].substr(1, end - 1));
    }
  }
  for (int r = 0; r < pg.size(); ++r) {
    if (all[r] == all[0]) continue;
    // The first line that differs: the group count, a group's size, or a parameter.
    std::istringstream a(all[0].substr(1)), b(all[r].substr(1));
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) la.clear(), lb.clear();
    throw UsageError(who + "rank " + std::to_string(r) +
                     " passed different parameters (count, shapes, dtypes or groups) than rank 0: rank 0 has \"" +
                     la + "\", rank " + std::to_string(r) + " \"" + lb +
                     "\"; every rank must build the same model and pass its parameters in the same order");
  }
}

}  // namespace

ZeroPartition partition_parameters(const std::vector<std::vector<int64_t>>& numels, int world_size) {
  TORCH_CHECK(world_size > 0, "partition_parameters: world size ", world_size);
  ZeroPartition out;
  out.numel.assign(world_size, 0);
  out.params.assign(world_size, std::vector<std::vector<size_t>>(numels.size()));
  for (size_t g = 0; g < numels.size(); ++g) {
    out.owner.emplace_back(numels[g].size(), 0);
    std::vector<size_t> order(numels[g].size());
    std::iota(order.begin(), order.end(), 0);
    // Python's sorted(key=numel, reverse=True) is stable: equal sizes keep their order.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[g][a] > numels[g][b]; });
    for (size_t i : order) {
      // The first rank with the fewest elements (values.index(min(values))).
      const int rank = static_cast<int>(std::min_element(out.numel.begin(), out.numel.end()) - out.numel.begin());
      out.owner[g][i] = rank;
      out.params[rank][g].push_back(i);
      out.numel[rank] += numels[g][i];
    }
  }
  return out;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> param_groups,
                                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                                                 OptimizerFactory make, std::shared_ptr<ProcessGroup> pg)
    : Optimizer(checked(std::move(param_groups), pg.get()), std::move(defaults)), pg_(std::move(pg)), make_(std::move(make)) {
  const std::string who = "ZeroRedundancyOptimizer on " + rank_tag(*pg_) + ": ";
  std::vector<std::vector<int64_t>> numels;
  std::ostringstream signature;
  signature << param_groups_.size() << " parameter group(s)\n";
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    numels.emplace_back();
    signature << "group " << g << ": " << param_groups_[g].params().size() << " parameter(s)\n";
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      const auto& p = param_groups_[g].params()[i];
      numels.back().push_back(p.numel());
      signature << "group " << g << " parameter " << i << ": " << describe_param(p) << "\n";
    }
  }
  numels_ = numels;
  partition_ = partition_parameters(numels_, pg_->size());

  // The wrapped optimizer checks its options; its complaint travels with the
  // signature, so that every rank throws, not only the one that complains.
  std::string error;
  try {
    local_ = make_(groups_of_rank(pg_->rank()));
    if (!local_) error = "the optimizer factory returned null";
    else if (dynamic_cast<torch::optim::LBFGS*>(local_.get()))
      error = "LBFGS is not supported (its line search and state span every parameter); use SGD, Adam, AdamW, "
              "Adagrad or RMSprop";
  } catch (const c10::Error& e) {
    error = std::string("the wrapped optimizer rejected its options: ") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = std::string("the wrapped optimizer could not be made: ") + e.what();
  }
  // A rank joining a running recoverable group cannot meet the others yet:
  // it takes its shards when taken in (regroup()).
  auto* recoverable = dynamic_cast<RecoverableGroup*>(pg_.get());
  if (recoverable && recoverable->joining()) {
    if (!error.empty()) throw UsageError(who + error);
    follow_regroups(true);
    return;
  }
  check_same_everywhere(*pg_, who, error, signature.str());
  if (recoverable) follow_regroups(false);
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::groups_of_rank(int rank) const {
  return groups_of(partition_, rank);
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::groups_of(const ZeroPartition& partition, int rank) const {
  std::vector<OptimizerParamGroup> out;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    std::vector<torch::Tensor> params;
    for (size_t i : partition.params[rank][g]) params.push_back(param_groups_[g].params()[i]);
    out.emplace_back(std::move(params), param_groups_[g].options().clone());
  }
  return out;
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::all_groups() const {
  std::vector<OptimizerParamGroup> out;
  for (const auto& g : param_groups_) out.emplace_back(g.params(), g.options().clone());
  return out;
}

void ZeroRedundancyOptimizer::check_groups_unchanged() const {
  bool same = param_groups_.size() == partition_.owner.size();
  for (size_t g = 0; same && g < param_groups_.size(); ++g) same = param_groups_[g].params().size() == partition_.owner[g].size();
  check_usage(same, "ZeroRedundancyOptimizer on ", rank_tag(*pg_),
              ": its parameter groups changed after it was made (add_param_group or params() edited); "
              "make a new ZeroRedundancyOptimizer over every group instead");
}

int ZeroRedundancyOptimizer::rank_of(const torch::Tensor& param) const {
  for (size_t g = 0; g < param_groups_.size() && g < partition_.owner.size(); ++g)
    for (size_t i = 0; i < param_groups_[g].params().size() && i < partition_.owner[g].size(); ++i)
      if (param_groups_[g].params()[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
        return partition_.owner[g][i];
  throw UsageError("ZeroRedundancyOptimizer on " + rank_tag(*pg_) + ": rank_of() was given a tensor it does not optimize");
}

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  check_groups_unchanged();
  // The group options of param_groups() rule (a scheduler changes those), as
  // PyTorch's _sync_param_groups before and after the local step.
  auto* recoverable = dynamic_cast<RecoverableGroup*>(pg_.get());
  check_usage(!recoverable || !shard_slots_.empty(), "ZeroRedundancyOptimizer on ", rank_tag(*pg_),
              ": step() on a rank still joining the recoverable group; grow() first (the kit: resume_or_start)");
  check_usage(!recoverable || recoverable->admit_joining(), "ZeroRedundancyOptimizer on ", rank_tag(*pg_),
              ": step() while the recoverable group holds joining ranks off (ddp::Join runs on it): a rank out of "
              "inputs would not take part in the parameters' broadcast (ZeRO is no Joinable); give every rank as "
              "many batches, or use a replicated optimizer under Join");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    local_->param_groups()[g].set_options(param_groups_[g].options().clone());
    if (backup_) backup_->param_groups()[g].set_options(param_groups_[g].options().clone());
  }
  auto loss = local_->step(std::move(closure));
  if (backup_) backup_->step();  // the shards backed up here: the same update, their second copy
  for (size_t g = 0; g < param_groups_.size(); ++g)
    param_groups_[g].set_options(local_->param_groups()[g].options().clone());
  if (!recoverable) {
    sync_params();
    return loss;
  }
  // The step committed on every rank before this one: a rank lost in the
  // broadcast leaves its shard's update on its backup's rank, from where
  // the re-forming brings it to every rank left (regroup()).
  try {
    sync_params();
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cerr << "ZeroRedundancyOptimizer on " << rank_tag(*pg_) << ": the parameters' broadcast failed ("
              << what.substr(0, what.find('\n')) << "); re-forming the group" << std::endl;
    recoverable->reform();
  }
  return loss;
}

// Each owner broadcasts its parameters, as PyTorch's one broadcast per
// parameter (the same values): a large one (>= kCoalesceBytes) in place, the
// small ones of a dtype gathered into flat tensors of up to kCoalesceBytes,
// so a model of many small tensors needs few collectives and the extra
// memory stays a few MiB whatever the model's size.
void ZeroRedundancyOptimizer::sync_params() {
  std::vector<int> owners(partition_.params.size());
  std::iota(owners.begin(), owners.end(), 0);
  sync_params(owners);
}

void ZeroRedundancyOptimizer::sync_params(const std::vector<int>& root_of_shard) {
  if (pg_->size() == 1) return;
  constexpr int64_t kCoalesceBytes = 1 << 20;
  torch::NoGradGuard no_grad;
  struct Flat {
    std::vector<torch::Tensor> params;
    torch::Tensor buffer;
    int root;
    int64_t bytes = 0;
  };
  std::vector<Flat> flats;
  std::vector<Work> works;
  auto launch = [&](Flat& f) {
    if (f.root == pg_->rank()) {
      std::vector<torch::Tensor> parts;
      for (const auto& p : f.params) parts.push_back(p.detach().reshape(-1));
      f.buffer = torch::cat(parts);
    } else {
      f.buffer = torch::empty({f.bytes / f.params[0].element_size()}, f.params[0].options().requires_grad(false));
    }
    works.push_back(pg_->broadcast(f.buffer, f.root));
  };
  for (size_t shard = 0; shard < partition_.params.size(); ++shard) {
    const int r = root_of_shard[shard];
    std::vector<Flat> open;  // one per dtype, filling
    for (size_t g = 0; g < param_groups_.size(); ++g)
      for (size_t i : partition_.params[shard][g]) {
        const auto& p = param_groups_[g].params()[i];
        const int64_t bytes = p.numel() * p.element_size();
        if (bytes >= kCoalesceBytes && p.is_contiguous()) {
          auto data = p.detach();
          works.push_back(pg_->broadcast(data, r));
          continue;
        }
        auto it = std::find_if(open.begin(), open.end(),
                               [&](const Flat& f) { return f.params[0].scalar_type() == p.scalar_type(); });
        if (it != open.end() && it->bytes + bytes > kCoalesceBytes) {
          launch(*it);
          flats.push_back(std::move(*it));
          open.erase(it);
          it = open.end();
        }
        if (it == open.end()) open.push_back({{p}, {}, r, bytes});
        else it->params.push_back(p), it->bytes += bytes;
      }
    for (auto& f : open) {
      launch(f);
      flats.push_back(std::move(f));
    }
  }
  for (auto& w : works) w.wait();
  for (auto& f : flats) {
    if (f.root == pg_->rank()) continue;
    int64_t offset = 0;
    for (auto& p : f.params) {
      p.detach().copy_(f.buffer.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  check_usage(to >= 0 && to < pg_->size(), "ZeroRedundancyOptimizer on ", rank_tag(*pg_), ": consolidate_state_dict(to=",
              to, ") is not a rank of this group of ", pg_->size());
  check_groups_unchanged();
  for (size_t g = 0; g < param_groups_.size(); ++g)
    local_->param_groups()[g].set_options(param_groups_[g].options().clone());
  const std::string mine = zero_state::to_bytes(*local_);
  consolidated_.reset();
  // As PyTorch: one object broadcast per rank (gather is not on every backend).
  std::vector<std::string> shares(pg_->size());
  for (int r = 0; r < pg_->size(); ++r) {
    auto bytes = detail::broadcast_bytes(*pg_, r == pg_->rank() ? mine : std::string(), r);
    if (pg_->rank() == to) shares[r] = std::move(bytes);
  }
  if (pg_->rank() != to) return;
  auto whole = make_(all_groups());
  for (int r = 0; r < pg_->size(); ++r) {
    auto share = make_(groups_of_rank(r));
    zero_state::from_bytes(*share, shares[r], torch::kCPU);
    for (size_t g = 0; g < param_groups_.size(); ++g)
      for (size_t i : partition_.params[r][g]) zero_state::move(*share, *whole, param_groups_[g].params()[i]);
  }
  consolidated_ = std::move(whole);
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  check_usage(consolidated_ != nullptr, "ZeroRedundancyOptimizer on ", rank_tag(*pg_),
              ": no consolidated state here; call consolidate_state_dict(", pg_->rank(),
              ") on every rank before state_dict() or save() on this one");
  consolidated_->save(archive);
}

std::string ZeroRedundancyOptimizer::state_dict() const {
  torch::serialize::OutputArchive archive;
  save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  check_groups_unchanged();
  auto whole = make_(all_groups());
  try {
    whole->load(archive);
  } catch (const c10::Error& e) {
    throw UsageError("ZeroRedundancyOptimizer on " + rank_tag(*pg_) +
                     ": the optimizer state does not fit these parameter groups (another model, another order, or "
                     "another optimizer): " + e.what_without_backtrace());
  }
  local_->state().clear();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(whole->param_groups()[g].options().clone());
    local_->param_groups()[g].set_options(whole->param_groups()[g].options().clone());
    for (size_t i : partition_.params[pg_->rank()][g]) zero_state::move(*whole, *local_, param_groups_[g].params()[i]);
  }
  if (!backup_) return;
  backup_->state().clear();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    backup_->param_groups()[g].set_options(whole->param_groups()[g].options().clone());
    for (const auto& p : backup_->param_groups()[g].params()) zero_state::move(*whole, *backup_, p);
  }
}

void ZeroRedundancyOptimizer::load_state_dict(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size(), pg_->device());
  } catch (const c10::Error& e) {
    throw UsageError("ZeroRedundancyOptimizer on " + rank_tag(*pg_) +
                     ": load_state_dict() was given bytes that are not an optimizer state (" +
                     e.what_without_backtrace() + "); pass what state_dict() returned");
  }
  load(archive);
}

}  // namespace ddp
