// In-process recovery: a group whose ranks can die (or fall silent) without
// ending the others. The survivors abort the broken group, meet again through
// the launcher's store and go on in a new, smaller group in the same
// processes; a step's optimizer update is applied only where every rank of
// the group finished its reduction, decided once for all, so the replicas stay
// equal with no copy of the model kept. Needs a launcher whose store outlives
// any worker: `ddprun --recover-in-process` (docs/launcher.md).
//
//   auto group = ddp::init_recoverable_group();
//   ddp::DistributedDataParallel model(net, group);   // follows the group's re-forming
//   while (step < steps) {
//     bool committed = group->run_step([&] {          // forward and backward
//       torch::nll_loss(model(x_of(step, group->rank(), group->size())), y).backward();
//     });
//     if (committed) { optimizer.step(); ++step; }    // else: the step again, on the new group
//     optimizer.zero_grad();
//   }
//
// A rank started in place of a lost one (ddprun does, while --max-restarts
// allows) joins at a step boundary: the step's vote takes it in, and it
// receives the running ranks' state (set_state) when the group grows.
//
// What follows the group as it re-forms: DistributedDataParallel (buckets,
// divisor), a DistributedSampler made on it, a ZeroRedundancyOptimizer (each
// shard kept on two ranks, re-sharded in on_regroup), ddp::Join (a joined
// rank votes on the steps it shadows), and whatever a program registers
// with on_regroup(). Refused, saying why: subgroups (dist::new_group: they
// would not re-form with it).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

struct RecoveryOptions {
  // A rank silent this long (no answer in a collective, no vote on a step)
  // counts as gone: the inner group's timeout, and the wait for the
  // survivors when the group re-forms. Shorter than a group's usual timeout.
  std::chrono::milliseconds deadline = std::chrono::seconds(30);
  // Below this many ranks, or ranks on fewer than min_nodes nodes, the group
  // does not re-form: reform() throws TooFewRanks. min_nodes 0: the
  // launcher's --nnodes minimum (ddprun sets DDPRUN_MIN_NODES), else 1.
  int min_world_size = 1;
  int min_nodes = 0;
  // How long a joining rank waits to be taken in.
  std::chrono::milliseconds join_timeout = std::chrono::minutes(30);
  // "gloo", "nccl" (its communicators aborted on a fault: LibTorch 2.x) or
  // "auto" (NCCL where a GPU is visible, else Gloo), as init_process_group.
  // Not "mpi": an MPI job cannot lose a process and go on.
  std::string backend = "auto";
};

// Where this rank stands in a recoverable group's current generation, kept
// up to date as the group re-forms or grows, shared with what follows the
// group (a DistributedSampler made on it) and valid after the group is gone.
struct GroupPosition {
  std::atomic<int> generation{0}, rank{0}, size{1};
};

// A ProcessGroup whose collectives run on the current generation's inner
// group: rank() and size() are this generation's, and change when it
// re-forms. Every rank keeps its launch rank as its slot (slot()), which
// names it in the store and in messages.
class RecoverableGroup : public ProcessGroup {
 public:
  // The collective that ends a step: true when every rank of the group
  // finished it (all called should_commit), false when one failed, died or
  // stayed silent past the deadline; the same answer on every rank. Apply
  // the step's update only on true, and call reform() on false.
  virtual bool should_commit() = 0;
  // The same vote for collectives between steps (an evaluation, the
  // checkpoint at an epoch's end): whether every rank finished them. It
  // never takes joining ranks in, so a rank joins only where a step is next.
  virtual bool agree() = 0;
  // After a CommError or a step that did not commit: tells the others,
  // aborts this generation's group, meets the ranks still there through the
  // store and forms the next generation's. Throws CommError when this rank
  // came too late to be taken in, TooFewRanks when fewer than the minimum
  // remain.
  virtual void reform() = 0;
  // run_step(fn): grow() when due, fn(), then should_commit(); a CommError
  // from fn or a vote against re-forms the group and returns false (the
  // step is to be run again), else true.
  bool run_step(const std::function<void()>& fn);

  // ---- growing
  // Whether this rank was started in place of a lost one and is not yet
  // taken in: its rank() and size() are the launch's, and it must call
  // grow() before any collective.
  virtual bool joining() const = 0;
  // What a joining rank receives: save() on the first rank that was in the
  // group before returns it, load() on the joining ranks takes it (the
  // model, the optimizer, the position). Set on every rank.
  virtual void set_state(std::function<std::string()> save, std::function<void(const std::string&)> load) = 0;
  // Whether a step's vote may take joining ranks in (true at the start).
  // Every rank sets it alike, between the same steps: ddp::Join holds them
  // off while it runs (a rank out of inputs holds an older model, and a rank
  // taken in receives the state of the group's first rank).
  virtual void set_admit_joining(bool admit) = 0;
  virtual bool admit_joining() const = 0;
  // True on a joining rank, and on the others after a committed step whose
  // vote took joining ranks in.
  virtual bool grow_pending() const = 0;
  // Collective over the group and the ranks it takes in: the next
  // generation, with them, and the state handed over. A joining rank waits
  // for it up to RecoveryOptions::join_timeout (then a CommError).
  virtual void grow() = 0;

  // ---- following the group
  // fn runs on every rank each time a generation forms (in reform(), and in
  // grow() after the state is handed over), before those return: a
  // collective over the new group that brings what follows the group in
  // line with it. A CommError from it re-forms again (and fn runs again on
  // the next generation); any other error ends reform() with it. Every rank
  // registers the same, in the same order; kept while the handle lives.
  virtual std::shared_ptr<void> on_regroup(std::function<void()> fn) = 0;

  // 0 for the group made at the start, +1 at each reform().
  virtual int generation() const = 0;
  // This rank's launch rank (RANK at start): it never changes.
  virtual int slot() const = 0;
  // The launcher's node it runs on (GROUP_RANK).
  virtual int node() const = 0;
  // The slots of this generation's ranks, in rank order.
  virtual std::vector<int> members() const = 0;
  // generation(), rank() and size(), as a shared handle (see GroupPosition).
  virtual std::shared_ptr<const GroupPosition> position() const = 0;
};

// reform() found fewer ranks, or nodes, than RecoveryOptions' minimum: the
// group ends. Every rank that was to be in the next generation throws it;
// writer() is whether this rank is the first of them (its lowest launch
// rank), the one to save what the others hold too (their states are equal:
// the failed step committed nowhere). The training kit saves a checkpoint
// there and exits with kPreemptedExitCode, as after a preemption.
// The writer calls saved() once it saved (or failed to); the others call
// wait_for_writer() before they end, so that their launcher does not stop
// the writer in the middle of its save.
class TooFewRanks : public CommError {
 public:
  TooFewRanks(const std::string& message, bool writer, std::function<void()> saved,
              std::function<bool(std::chrono::milliseconds)> wait_for_writer)
      : CommError(message), writer_(writer), saved_(std::move(saved)), wait_(std::move(wait_for_writer)) {}
  bool writer() const { return writer_; }
  void saved() const { saved_(); }
  // Whether the writer said so within `timeout`.
  bool wait_for_writer(std::chrono::milliseconds timeout) const { return wait_(timeout); }

 private:
  bool writer_;
  std::function<void()> saved_;
  std::function<bool(std::chrono::milliseconds)> wait_;
};

// Re-forming found state of which no copy is left (a ZeroRedundancyOptimizer
// shard whose two ranks were lost together): the group cannot go on
// exactly. Not retried; restart from the last checkpoint.
class StateLost : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

// The process's group, made recoverable, and its default group: every rank
// joins the launcher's store as a client (ddprun --recover-in-process sets
// DDPRUN_RECOVER_IN_PROCESS and TORCHELASTIC_USE_AGENT_STORE). Without that
// launch, a UsageError that says how to start it.
std::shared_ptr<RecoverableGroup> init_recoverable_group(const RecoveryOptions& options = {});

// Whether this process was launched for in-process recovery.
bool recovery_launched();

}  // namespace ddp
