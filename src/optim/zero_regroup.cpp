// A ZeroRedundancyOptimizer on a recoverable group: each shard kept on two
// ranks (its owner and a backup rank, on another node where there is one),
// and re-sharded over the new group each time the group re-forms or grows.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "comm/objects/object_exchange.h"
#include "ddp/comm/recovery.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "optim/zero_state.h"

namespace ddp {
namespace {

std::string numbers_text(const std::vector<int>& numbers) {
  std::ostringstream s;
  for (size_t i = 0; i < numbers.size(); ++i) s << (i ? "," : "") << numbers[i];
  return s.str();
}

std::vector<int> numbers_of(const std::string& text) {
  std::vector<int> out;
  std::istringstream s(text);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// Which rank of the new group sends each old shard, and the new group's nodes.
struct ShardSources {
  int root = 0;                // the first rank that holds a partition
  std::vector<int> old_slots;  // the partition's launch ranks
  std::vector<int> source;     // [old shard] -> new rank
  std::vector<int> nodes;      // [new rank] -> its node
};

// Collective (one all-gather of each rank's node and the partition it
// holds): for each old shard, its owner if still here, else its backup rank,
// else StateLost. A rank just taken in holds none.
ShardSources find_sources(ProcessGroup& pg, int node, const std::vector<int>& slots, const std::vector<int>& nodes,
                          const std::vector<int>& members, const std::string& who) {
  const auto all = detail::all_gather_bytes(pg, std::to_string(node) + ";" + numbers_text(slots) + ";" +
                                                    numbers_text(nodes));
  const int size = pg.size();
  std::vector<std::string> held(static_cast<size_t>(size));
  ShardSources out;
  for (int r = 0; r < size; ++r) {
    const auto semicolon = all[r].find(';');
    out.nodes.push_back(std::stoi(all[r].substr(0, semicolon)));
    held[r] = all[r].substr(semicolon + 1);
    if (held[r] == ";") held[r].clear();
  }
  while (out.root < size && held[out.root].empty()) ++out.root;
  if (out.root == size) throw StateLost(who + "no rank of the group holds a shard of the optimizer's state");
  for (int r = out.root + 1; r < size; ++r)
    TORCH_CHECK(held[r].empty() || held[r] == held[out.root], who, "ranks ", out.root, " and ", r,
                " hold different partitions (", held[out.root], " / ", held[r], "); a bug in libddp");
  const auto semicolon = held[out.root].find(';');
  out.old_slots = numbers_of(held[out.root].substr(0, semicolon));
  const std::vector<int> old_nodes = numbers_of(held[out.root].substr(semicolon + 1));
  auto holder = [&](int slot) {
    const auto it = std::find(members.begin(), members.end(), slot);
    const int r = static_cast<int>(it - members.begin());
    return it != members.end() && !held[r].empty() ? r : -1;
  };
  for (int k = 0; k < static_cast<int>(out.old_slots.size()); ++k) {
    const int backup = zero_backup_rank(k, old_nodes);
    int s = holder(out.old_slots[k]);
    if (s < 0 && backup >= 0) s = holder(out.old_slots[backup]);
    if (s < 0)
      throw StateLost(who + "the optimizer's shard of launch rank " + std::to_string(out.old_slots[k]) +
                      " was lost with both ranks that held it (launch ranks " + std::to_string(out.old_slots[k]) +
                      (backup >= 0 ? " and " + std::to_string(out.old_slots[backup]) : std::string()) +
                      "); the run cannot go on exactly: restart it from its last checkpoint");
    out.source.push_back(s);
  }
  return out;
}

}  // namespace

int zero_backup_rank(int shard, const std::vector<int>& nodes) {
  const int size = static_cast<int>(nodes.size());
  if (size < 2) return -1;
  const int node = nodes[shard];
  const int on_node = static_cast<int>(std::count(nodes.begin(), nodes.end(), node));
  if (nodes[(shard + on_node) % size] != node) return (shard + on_node) % size;
  for (int d = 1; d < size; ++d)
    if (nodes[(shard + d) % size] != node) return (shard + d) % size;
  return (shard + 1) % size;
}

std::vector<torch::optim::OptimizerParamGroup> ZeroRedundancyOptimizer::backed_up_groups(
    const ZeroPartition& partition, const std::vector<int>& nodes, int rank) const {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    std::vector<torch::Tensor> params;
    for (int k = 0; k < static_cast<int>(nodes.size()); ++k)
      if (zero_backup_rank(k, nodes) == rank)
        for (size_t i : partition.params[static_cast<size_t>(k)][g]) params.push_back(param_groups_[g].params()[i]);
    out.emplace_back(std::move(params), param_groups_[g].options().clone());
  }
  return out;
}

void ZeroRedundancyOptimizer::follow_regroups(bool joining) {
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  if (!joining) {
    shard_slots_ = group.members();
    shard_nodes_.clear();
    for (const auto& node : detail::all_gather_bytes(*pg_, std::to_string(group.node())))
      shard_nodes_.push_back(std::stoi(node));
    if (pg_->size() > 1) backup_ = make_(backed_up_groups(partition_, shard_nodes_, pg_->rank()));
  }
  regroup_handle_ = group.on_regroup([this] { regroup(); });
}

// Collective over the new group, run by RecoverableGroup as it forms: each
// old shard's source (find_sources); every parameter broadcast from its
// shard's source (after a step whose broadcast failed, the ranks differ
// until then); the partition over the new group, each rank receiving its
// new shard's state and those it backs up (take_shards); then a vote: the
// new shards replace the old ones only where every rank got this far, so a
// fault here leaves the old ones for the next try.
void ZeroRedundancyOptimizer::regroup() {
  check_groups_unchanged();
  auto& group = dynamic_cast<RecoverableGroup&>(*pg_);
  const std::string who = "ZeroRedundancyOptimizer on " + rank_tag(*pg_) + ": ";
  const std::vector<int> members = group.members();
  const ShardSources from = find_sources(*pg_, group.node(), shard_slots_, shard_nodes_, members, who);
  // A rank just taken in holds no shard, but broadcasts by the partition too.
  if (shard_slots_.empty()) partition_ = partition_parameters(numels_, static_cast<int>(from.old_slots.size()));
  sync_params(from.source);

  const int size = pg_->size(), me = pg_->rank();
  ZeroPartition next = partition_parameters(numels_, size);
  auto local = make_(groups_of(next, me));
  auto backup = size > 1 ? make_(backed_up_groups(next, from.nodes, me)) : nullptr;
  take_shards(from.source, from.root, from.nodes, next, *local, backup.get());

  if (!group.agree()) throw CommError(who + "re-sharding the optimizer's state did not finish on every rank");
  partition_ = std::move(next);
  local_ = std::move(local);
  backup_ = std::move(backup);
  shard_slots_ = members;
  shard_nodes_ = from.nodes;
  if (me == 0)
    std::cerr << who << "re-sharded over launch ranks " << numbers_text(members) << " (from "
              << numbers_text(from.old_slots) << ")" << std::endl;
}

// Each source in turn broadcasts its old shards' state; every rank moves
// what the new partition `next` gives it into `local` (its shard) and
// `backup` (the shards it backs up), and takes the group options from the
// first holder's.
void ZeroRedundancyOptimizer::take_shards(const std::vector<int>& source, int root, const std::vector<int>& nodes,
                                          const ZeroPartition& next, torch::optim::Optimizer& local,
                                          torch::optim::Optimizer* backup) {
  const int size = pg_->size(), me = pg_->rank();
  std::vector<bool> backs(static_cast<size_t>(size));
  for (int k = 0; k < size; ++k) backs[static_cast<size_t>(k)] = zero_backup_rank(k, nodes) == me;
  for (int s = 0; s < size; ++s) {
    // The parameter groups of the shards s is the source of, in shard order.
    std::vector<torch::optim::OptimizerParamGroup> sent;
    bool any = s == root;  // it sends the group options too
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      std::vector<torch::Tensor> params;
      for (size_t k = 0; k < source.size(); ++k)
        if (source[k] == s)
          for (size_t i : partition_.params[k][g]) params.push_back(param_groups_[g].params()[i]);
      any = any || !params.empty();
      sent.emplace_back(std::move(params), param_groups_[g].options().clone());
    }
    if (!any) continue;  // the same on every rank: source is
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
      if (s == root) {  // the group options (a scheduler's learning rate)
        param_groups_[g].set_options(in->param_groups()[g].options().clone());
        local.param_groups()[g].set_options(in->param_groups()[g].options().clone());
        if (backup) backup->param_groups()[g].set_options(in->param_groups()[g].options().clone());
      }
      for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
        const int owner = next.owner[g][i];
        if (owner == me) zero_state::move(*in, local, param_groups_[g].params()[i]);
        else if (backup && backs[static_cast<size_t>(owner)]) zero_state::move(*in, *backup, param_groups_[g].params()[i]);
      }
    }
  }
}

}  // namespace ddp
