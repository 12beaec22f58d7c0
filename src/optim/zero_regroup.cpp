// A ZeroRedundancyOptimizer on a recoverable group: each shard kept on two
// ranks (its owner's and the previous rank's backup), and re-sharded over
// the new group each time the group re-forms or grows.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "comm/objects/object_exchange.h"
#include "ddp/comm/recovery.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "optim/zero_state.h"

namespace ddp {
namespace {

std::string slots_text(const std::vector<int>& slots) {
  std::ostringstream s;
  for (size_t i = 0; i < slots.size(); ++i) s << (i ? "," : "") << slots[i];
  return s.str();
}

std::vector<int> slots_of(const std::string& text) {
  std::vector<int> out;
  std::istringstream s(text);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// Which rank of the new group sends each old shard.
struct ShardSources {
  int root = 0;                 // the first rank that holds a partition
  std::vector<int> old_slots;   // the partition's launch ranks
  std::vector<int> source;      // [old shard] -> new rank
};

// Collective (one all-gather of what each rank holds): for each old shard,
// its owner if still here, else its backup's rank (the previous one), else
// StateLost. A rank just taken in holds none.
ShardSources find_sources(ProcessGroup& pg, const std::vector<int>& held_here, const std::vector<int>& members,
                          const std::string& who) {
  const auto held = detail::all_gather_bytes(pg, slots_text(held_here));
  ShardSources out;
  const int size = pg.size();
  while (out.root < size && held[out.root].empty()) ++out.root;
  if (out.root == size) throw StateLost(who + "no rank of the group holds a shard of the optimizer's state");
  for (int r = out.root + 1; r < size; ++r)
    TORCH_CHECK(held[r].empty() || held[r] == held[out.root], who, "ranks ", out.root, " and ", r,
                " hold different partitions (", held[out.root], " / ", held[r], "); a bug in libddp");
  out.old_slots = slots_of(held[out.root]);
  const int old_size = static_cast<int>(out.old_slots.size());
  auto holder = [&](int slot) {
    const auto it = std::find(members.begin(), members.end(), slot);
    const int r = static_cast<int>(it - members.begin());
    return it != members.end() && !held[r].empty() ? r : -1;
  };
  for (int k = 0; k < old_size; ++k) {
    const int previous = out.old_slots[(k + old_size - 1) % old_size];
    int s = holder(out.old_slots[k]);
    if (s < 0 && old_size > 1) s = holder(previous);
    if (s < 0)
      throw StateLost(who + "the optimizer's shard of launch rank " + std::to_string(out.old_slots[k]) +
                      " was lost with both ranks that held it (launch ranks " + std::to_string(previous) + " and " +
                      std::to_string(out.old_slots[k]) +
                      "); the run cannot go on exactly: restart it from its last checkpoint");
    out.source.push_back(s);
  }
  return out;
}

}  // namespace

void ZeroRedundancyOptimizer::follow_regroups(bool joining) {
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  if (!joining) {
    shard_slots_ = group.members();
    if (pg_->size() > 1) backup_ = make_(groups_of_rank((pg_->rank() + 1) % pg_->size()));
  }
  regroup_handle_ = group.on_regroup([this] { regroup(); });
}

// Collective over the new group, run by RecoverableGroup as it forms: each
// old shard's source (find_sources); every parameter broadcast from its
// shard's source (after a step whose broadcast failed, the ranks differ
// until then); the partition over the new group, each rank receiving its
// new shard's state and its backup's (take_shards); then a vote: the new
// shards replace the old ones only where every rank got this far, so a
// fault here leaves the old ones for the next try.
void ZeroRedundancyOptimizer::regroup() {
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  const std::string who = "ZeroRedundancyOptimizer on " + rank_tag(*pg_) + ": ";
  const std::vector<int> members = group.members();
  const ShardSources from = find_sources(*pg_, shard_slots_, members, who);
  std::vector<std::vector<int64_t>> numels;
  for (const auto& g : param_groups_) {
    numels.emplace_back();
    for (const auto& p : g.params()) numels.back().push_back(p.numel());
  }
  // A rank just taken in holds no shard, but broadcasts by the partition too.
  if (shard_slots_.empty()) partition_ = partition_parameters(numels, static_cast<int>(from.old_slots.size()));
  sync_params(from.source);

  const int size = pg_->size(), me = pg_->rank();
  ZeroPartition next = partition_parameters(numels, size);
  auto local = make_(groups_of(next, me));
  auto backup = size > 1 ? make_(groups_of(next, (me + 1) % size)) : nullptr;
  take_shards(from.source, from.root, next, *local, backup.get());

  if (!group.agree()) throw CommError(who + "re-sharding the optimizer's state did not finish on every rank");
  partition_ = std::move(next);
  local_ = std::move(local);
  backup_ = std::move(backup);
  shard_slots_ = members;
  if (me == 0)
    std::cerr << who << "re-sharded over launch ranks " << slots_text(members) << " (from "
              << slots_text(from.old_slots) << ")" << std::endl;
}

// Each source in turn broadcasts its old shards' state; every rank moves
// what the new partition `next` gives it into `local` (its shard) and
// `backup` (the next rank's), and takes the group options from `root`'s.
void ZeroRedundancyOptimizer::take_shards(const std::vector<int>& source, int root, const ZeroPartition& next,
                                          torch::optim::Optimizer& local, torch::optim::Optimizer* backup) {
  const int size = pg_->size(), me = pg_->rank(), backup_rank = (me + 1) % size;
  for (int s = 0; s < size; ++s) {
    // The parameter groups of the shards s is the source of, in shard order.
    std::vector<torch::optim::OptimizerParamGroup> sent;
    bool any = false;
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      std::vector<torch::Tensor> params;
      for (size_t k = 0; k < source.size(); ++k)
        if (source[k] == s)
          for (size_t i : partition_.params[k][g]) params.push_back(param_groups_[g].params()[i]);
      any = any || !params.empty();
      sent.emplace_back(std::move(params), param_groups_[g].options().clone());
    }
    if (!any) continue;  // the same on every rank: source[] is
    // The source shares its state (the same tensors: nothing here changes
    // them, and the old shards go once the new ones are in place).
    auto in = make_(sent);
    std::string bytes;
    if (s == me) {
      for (size_t g = 0; g < param_groups_.size(); ++g)
        for (const auto& p : sent[g].params()) {
          zero_state::share(*local_, *in, p);
          if (backup_) zero_state::share(*backup_, *in, p);
        }
      bytes = zero_state::to_bytes(*in);
    }
    bytes = detail::broadcast_bytes(*pg_, std::move(bytes), s);
    if (s != me) zero_state::from_bytes(*in, bytes, pg_->device());
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      if (s == root) {  // the group options (a scheduler's learning rate): the first holder's
        param_groups_[g].set_options(in->param_groups()[g].options().clone());
        local.param_groups()[g].set_options(in->param_groups()[g].options().clone());
        if (backup) backup->param_groups()[g].set_options(in->param_groups()[g].options().clone());
      }
      for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
        const int owner = next.owner[g][i];
        if (owner == me) zero_state::move(*in, local, param_groups_[g].params()[i]);
        else if (backup && owner == backup_rank) zero_state::move(*in, *backup, param_groups_[g].params()[i]);
      }
    }
  }
}

}  // namespace ddp
