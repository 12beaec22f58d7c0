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

}  // namespace

void ZeroRedundancyOptimizer::follow_regroups(bool joining) {
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  if (!joining) {
    shard_slots_ = group.members();
    if (pg_->size() > 1) backup_ = make_(groups_of_rank((pg_->rank() + 1) % pg_->size()));
  }
  regroup_handle_ = group.on_regroup([this] { regroup(); });
}

// Collective over the new group, run by RecoverableGroup as it forms:
//  1. the partition's launch ranks, from the first rank that holds one (a
//     rank just taken in holds none);
//  2. for each old shard, its source: its owner if still here, else its
//     backup's rank, else StateLost;
//  3. every parameter broadcast from its shard's source (after a step whose
//     broadcast failed, the ranks differ until then);
//  4. the partition over the new group, and each source's shards' state
//     broadcast in turn: each rank keeps its new shard's and its backup's;
//  5. a vote: the new shards replace the old ones only where every rank got
//     this far, so a fault here leaves the old ones for the next try.
void ZeroRedundancyOptimizer::regroup() {
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  const std::string who = "ZeroRedundancyOptimizer on " + rank_tag(*pg_) + ": ";
  const int size = pg_->size(), me = pg_->rank();

  const auto held = detail::all_gather_bytes(*pg_, slots_text(shard_slots_));
  int root = 0;
  while (root < size && held[root].empty()) ++root;
  if (root == size) throw StateLost(who + "no rank of the group holds a shard of the optimizer's state");
  for (int r = root + 1; r < size; ++r)
    TORCH_CHECK(held[r].empty() || held[r] == held[root], who, "ranks ", root, " and ", r,
                " hold different partitions (", held[root], " / ", held[r], "); a bug in libddp");
  const std::vector<int> old_slots = slots_of(held[root]);
  const int old_size = static_cast<int>(old_slots.size());
  const std::vector<int> members = group.members();
  std::vector<std::vector<int64_t>> numels;
  for (const auto& g : param_groups_) {
    numels.emplace_back();
    for (const auto& p : g.params()) numels.back().push_back(p.numel());
  }
  // A rank just taken in holds no shard, but broadcasts by the partition too.
  if (shard_slots_.empty()) partition_ = partition_parameters(numels, old_size);

  // The new rank that holds old shard k as its owner or backup, or -1.
  auto holder = [&](int slot) {
    const auto it = std::find(members.begin(), members.end(), slot);
    const int r = static_cast<int>(it - members.begin());
    return it != members.end() && !held[r].empty() ? r : -1;
  };
  std::vector<int> source(static_cast<size_t>(old_size));
  for (int k = 0; k < old_size; ++k) {
    int s = holder(old_slots[k]);
    if (s < 0 && old_size > 1) s = holder(old_slots[(k + old_size - 1) % old_size]);
    if (s < 0)
      throw StateLost(who + "the optimizer's shard of launch rank " + std::to_string(old_slots[k]) +
                      " was lost with both ranks that held it (launch ranks " +
                      std::to_string(old_slots[(k + old_size - 1) % old_size]) + " and " +
                      std::to_string(old_slots[k]) +
                      "); the run cannot go on exactly: restart it from its last checkpoint");
    source[static_cast<size_t>(k)] = s;
  }

  sync_params(source);

  ZeroPartition next = partition_parameters(numels, size);
  const int backup_rank = (me + 1) % size;
  auto local = make_(groups_of(next, me));
  auto backup = size > 1 ? make_(groups_of(next, backup_rank)) : nullptr;

  for (int s = 0; s < size; ++s) {
    // The parameter groups of the shards s is the source of, in shard order.
    std::vector<torch::optim::OptimizerParamGroup> sent;
    bool any = false;
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      std::vector<torch::Tensor> params;
      for (int k = 0; k < old_size; ++k)
        if (source[static_cast<size_t>(k)] == s)
          for (size_t i : partition_.params[static_cast<size_t>(k)][g]) params.push_back(param_groups_[g].params()[i]);
      any = any || !params.empty();
      sent.emplace_back(std::move(params), param_groups_[g].options().clone());
    }
    if (!any) continue;  // the same on every rank: source[] is
    // The source shares its state (the same tensors: nothing here changes
    // them, and the old shards go once the new ones are in place).
    auto in = make_(sent);
    std::string bytes;
    if (s == me) {
      for (size_t g = 0; g < param_groups_.size(); ++g) {
        in->param_groups()[g].set_options(param_groups_[g].options().clone());
        for (const auto& p : sent[g].params()) {
          zero_state::share(*local_, *in, p);
          if (backup_) zero_state::share(*backup_, *in, p);
        }
      }
      bytes = zero_state::to_bytes(*in);
    }
    bytes = detail::broadcast_bytes(*pg_, std::move(bytes), s);
    if (s != me) zero_state::from_bytes(*in, bytes, pg_->device());
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      // The group options (a scheduler's learning rate): the first holder's.
      if (s == root) {
        param_groups_[g].set_options(in->param_groups()[g].options().clone());
        local->param_groups()[g].set_options(in->param_groups()[g].options().clone());
        if (backup) backup->param_groups()[g].set_options(in->param_groups()[g].options().clone());
      }
      for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
        const int owner = next.owner[g][i];
        if (owner == me) zero_state::move(*in, *local, param_groups_[g].params()[i]);
        else if (backup && owner == backup_rank) zero_state::move(*in, *backup, param_groups_[g].params()[i]);
      }
    }
  }

  if (!group.agree())
    throw CommError(who + "re-sharding the optimizer's state did not finish on every rank");
  partition_ = std::move(next);
  local_ = std::move(local);
  backup_ = std::move(backup);
  shard_slots_ = members;
  if (me == 0)
    std::cerr << who << "re-sharded over launch ranks " << slots_text(members) << " (from " << slots_text(old_slots)
              << ")" << std::endl;
}

}  // namespace ddp
