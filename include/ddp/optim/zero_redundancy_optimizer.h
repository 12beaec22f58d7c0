// ZeRO stage 1, as PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer:
// wraps a LibTorch optimizer so that each rank keeps optimizer state (Adam's
// moments, SGD's momentum) for its own share of the parameters only, about
// 1/W of it. step() steps this rank's share, then every rank broadcasts the
// parameters it owns. Parameters are shared out as PyTorch does: each group's
// parameters largest first, each to the rank with the fewest elements so far.
//
//   ddp::DistributedDataParallel model(net, pg);
//   ddp::ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(1e-3), pg);
//   for (...) { opt.zero_grad(); loss(model(x), y).backward(); opt.step(); }
//   opt.consolidate_state_dict(0);             // collective
//   if (pg->rank() == 0) torch::save(opt, "optimizer.pt");  // the full state
//   auto archive = ddp::read_archive("optimizer.pt");  // ddp/train/state_dict.h: data only
//   opt.load(archive);                         // any rank, any world size: its share
//
// It is a torch::optim::Optimizer: zero_grad(), step(), param_groups() (and
// LR schedulers through them) work where one is expected. Its state() is
// empty: the shard's state is local_optimizer().state().
//
// On a recoverable group (ddp/comm/recovery.h) each shard lives on two
// ranks: its owner and a backup rank on another node where the group spans
// several (zero_backup_rank), which steps it too with the same averaged
// gradients, so the copies stay bitwise equal (about twice the optimizer's
// state and update per rank, no extra communication a step). When the group
// re-forms or grows, the parameters come from a rank that holds each shard,
// the shards are partitioned anew over the new group and each rank receives
// its own and the ones it backs up (every shard's state crosses the network
// once); local_optimizer() is then a new object. A step whose parameter
// broadcast fails re-forms the group inside step(), which returns with the
// step applied on every rank left. A shard's two ranks lost at once:
// StateLost. Parameters DDP ignores (params_and_buffers_to_ignore) keep
// local gradients, so their backup copy follows the backup rank's own.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/errors.h"
#include "ddp/comm/process_group.h"

namespace ddp {

// Which rank owns which parameter: PyTorch 1.13's _partition_parameters. For
// each group in turn, its parameters sorted by numel, largest first (a stable
// sort: ties keep their order), each go to the rank with the fewest elements
// so far over all groups (the lowest such rank on a tie).
struct ZeroPartition {
  std::vector<std::vector<int>> owner;                   // [group][param] -> rank
  std::vector<std::vector<std::vector<size_t>>> params;  // [rank][group] -> param indices, in the local optimizer's order
  std::vector<int64_t> numel;                            // [rank] -> elements owned
};
// numels[g][i]: the number of elements of parameter i of group g.
ZeroPartition partition_parameters(const std::vector<std::vector<int64_t>>& numels, int world_size);

// On a recoverable group, the rank that keeps a second copy of `shard`, given
// each rank's node (nodes[r]): as many ranks on as the shard's node has (the
// same local rank of the next node, when nodes hold as many ranks), else the
// first rank after it on another node, else the next rank; -1 for one rank.
int zero_backup_rank(int shard, const std::vector<int>& nodes);

// Builds the wrapped optimizer over the parameter groups it is given (this
// rank's share; on consolidation and loading, every rank's).
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

// The LibTorch optimizer an options type makes. LBFGS is not supported: its
// line search evaluates the closure per shard, and its state is global.
template <typename Options>
struct ZeroOptimizerFor {
  static_assert(!std::is_same_v<Options, Options>,
                "ZeroRedundancyOptimizer supports SGD, Adam, AdamW, Adagrad and RMSprop options; for another "
                "optimizer pass an OptimizerFactory");
};
template <> struct ZeroOptimizerFor<torch::optim::SGDOptions> { using type = torch::optim::SGD; };
template <> struct ZeroOptimizerFor<torch::optim::AdamOptions> { using type = torch::optim::Adam; };
template <> struct ZeroOptimizerFor<torch::optim::AdamWOptions> { using type = torch::optim::AdamW; };
template <> struct ZeroOptimizerFor<torch::optim::AdagradOptions> { using type = torch::optim::Adagrad; };
template <> struct ZeroOptimizerFor<torch::optim::RMSpropOptions> { using type = torch::optim::RMSprop; };

class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // Collective (one all-gather): every rank must pass the same number of
  // parameters with the same shapes and dtypes, in the same groups;
  // otherwise every rank throws UsageError naming the first rank that
  // differs. Options the wrapped optimizer rejects are a UsageError too.
  template <typename Options>
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, const Options& defaults,
                          std::shared_ptr<ProcessGroup> pg = default_process_group())
      : ZeroRedundancyOptimizer(std::move(param_groups), static_cast<const torch::optim::OptimizerOptions&>(defaults).clone(),
                                factory_for(defaults), std::move(pg)) {}
  template <typename Options>
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> params, const Options& defaults,
                          std::shared_ptr<ProcessGroup> pg = default_process_group())
      : ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                                    std::move(params))},
                                defaults, std::move(pg)) {}
  // Any optimizer: `make` builds it over parameter groups whose options are
  // `defaults` where a group has none.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          std::unique_ptr<torch::optim::OptimizerOptions> defaults, OptimizerFactory make,
                          std::shared_ptr<ProcessGroup> pg);

  // Collective: steps this rank's share with the group options of
  // param_groups(), then broadcasts each rank's share from it: parameters
  // of 1 MiB or more in place, smaller ones coalesced into flat tensors of
  // up to 1 MiB per dtype (PyTorch: one broadcast per parameter).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Collective: every rank's share of the state goes to rank `to`, where
  // state_dict()/save() then give the whole optimizer's state. A snapshot:
  // call it again after further steps.
  void consolidate_state_dict(int to = 0);
  // On the rank consolidated to: the whole state in the wrapped optimizer's
  // own format (torch::optim::Adam::save over every parameter, in order), so
  // a plain torch::optim::Adam over the same groups loads it too. UsageError
  // elsewhere, or before consolidate_state_dict.
  std::string state_dict() const;
  void save(torch::serialize::OutputArchive& archive) const override;
  // Any rank (not collective): takes its own share of a whole state, from
  // state_dict() at any world size or from the plain optimizer's save(), and
  // the group options. Tensors go to the process group's device. The bytes
  // go to LibTorch's reader, which runs the code an archive carries: give
  // it what state_dict() returned in this job, and read a file with
  // ddp::read_archive(path) and load(archive) instead.
  void load_state_dict(const std::string& bytes);
  void load(torch::serialize::InputArchive& archive) override;

  // The rank that owns `param` (UsageError for a tensor it does not hold).
  int rank_of(const torch::Tensor& param) const;
  const ZeroPartition& partition() const { return partition_; }
  // The optimizer over this rank's share: its state() is this rank's state.
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }
  // On a recoverable group, the optimizer over the shards this rank keeps
  // the second copy of; null elsewhere.
  torch::optim::Optimizer* backup_optimizer() { return backup_.get(); }
  ProcessGroup& process_group() const { return *pg_; }

  // It registers itself with a recoverable group by address.
  ZeroRedundancyOptimizer(ZeroRedundancyOptimizer&&) = delete;
  ZeroRedundancyOptimizer& operator=(ZeroRedundancyOptimizer&&) = delete;

 private:
  template <typename Options>
  static OptimizerFactory factory_for(const Options& defaults) {
    using Opt = typename ZeroOptimizerFor<Options>::type;
    return [defaults](std::vector<torch::optim::OptimizerParamGroup> groups) {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Opt>(std::move(groups), defaults));
    };
  }
  std::vector<torch::optim::OptimizerParamGroup> groups_of_rank(int rank) const;
  std::vector<torch::optim::OptimizerParamGroup> groups_of(const ZeroPartition& partition, int rank) const;
  std::vector<torch::optim::OptimizerParamGroup> all_groups() const;
  void check_groups_unchanged() const;
  // Each shard's parameters broadcast from root_of_shard[shard] (its owner
  // after a step; after a re-forming, a rank of the new group that holds it).
  void sync_params(const std::vector<int>& root_of_shard);
  void sync_params();
  // On a recoverable group: the collective re-sharding run as it re-forms
  // (zero_regroup.cpp).
  void follow_regroups(bool joining);
  void regroup();
  void take_shards(const std::vector<int>& source, int root, const std::vector<int>& nodes, const ZeroPartition& next,
                   torch::optim::Optimizer& local, torch::optim::Optimizer* backup);
  std::vector<torch::optim::OptimizerParamGroup> backed_up_groups(const ZeroPartition& partition,
                                                                  const std::vector<int>& nodes, int rank) const;

  std::shared_ptr<ProcessGroup> pg_;
  OptimizerFactory make_;
  std::vector<std::vector<int64_t>> numels_;  // [group][param]: what the partitions share out
  ZeroPartition partition_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  // On a recoverable group: the shards this rank backs up (their second
  // copy), the launch ranks (slots) and nodes of the group the partition was
  // made for (empty on a rank still joining), and the registration of regroup().
  std::unique_ptr<torch::optim::Optimizer> backup_;
  std::vector<int> shard_slots_, shard_nodes_;
  std::shared_ptr<void> regroup_handle_;
  std::unique_ptr<torch::optim::Optimizer> consolidated_;  // the whole state, on the rank consolidated to
};

}  // namespace ddp
