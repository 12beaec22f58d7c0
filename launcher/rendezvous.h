// How the nodes of a run find each other and agree on who is who.
//
// Three implementations:
//   LocalRendezvous   one node (static --nnodes 1, --standalone): no store.
//   StoreRendezvous   several nodes over a c10d::TCPStore, in two flavours:
//     static  node ranks from --node-rank, exactly --nnodes nodes, the store
//             hosted by node 0 at --master-addr:--master-port;
//     c10d    node ranks in join order, MIN..MAX nodes with a last-call
//             window, the store at --rdzv-endpoint hosted by the node that
//             can bind it.
// Rounds are numbered from 0 and every restart (after a failure, or to admit
// nodes that wait) is a fresh rendezvous in the next round. A c10d node that
// arrives while a round runs waits, counted in that round's waiting list;
// the running nodes see the list at their next poll and restart to let it in
// (up to MAX), as torchrun's agents do.
// After the join the store carries the run's fate: a failure record (first
// writer wins), keep-alive counters, and the exit barrier. docs/launcher.md
// lists the keys.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"

namespace ddprun {

// What this node's workers need to know after a rendezvous.
struct Assignment {
  int round = 0;        // restart count of the group (TORCHELASTIC_RESTART_COUNT)
  int group_rank = 0;   // this node's rank (GROUP_RANK)
  int num_nodes = 1;    // GROUP_WORLD_SIZE
  int rank_offset = 0;  // RANK of this node's local rank 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // Every node of the group in node-rank order, as "host[ddprun pid]": what
  // a membership change compares (membership.h).
  std::vector<std::string> nodes;
};

// Why a round ended badly; the first one reported is the one every node uses.
struct FailureRecord {
  int exit_code = 1;
  bool restartable = true;  // false when ddprun itself was told to stop
  std::string text;         // "rank 3 (local rank 1) on host h: exit code 7"
  std::string message;      // the worker's error file's message ("ddp::CommError: ..."), if any
  // Not a failure: nodes wait to join a group below MAX (c10d). Every node
  // stops its workers and re-rendezvouses; no restart is counted.
  bool membership = false;
  static constexpr size_t kMaxMessage = 4096;  // what travels through the store
  std::string serialize() const;
  static FailureRecord parse(const std::string& text);
};

// Called while waiting; reads ddprun's signals and throws Interrupted.
using Tick = std::function<void()>;

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Forms round `round` (or a later one already under way, for a node that
  // arrives during a restart). Every wait is bounded by join_timeout.
  virtual Assignment join(int round, int local_world_size, const Tick& tick) = 0;
  // From the monitor loop: sends keep-alives, checks the other nodes', and
  // returns the round's failure record once any node has written one. With
  // `admit` (the group runs healthy), nodes waiting to join below MAX write
  // a membership record (FailureRecord::membership) that every node follows.
  // Throws LaunchError when the store is lost.
  virtual std::optional<FailureRecord> poll(bool admit) = 0;
  // Writes `record` unless another node's came first; returns the winner.
  virtual FailureRecord report_failure(const FailureRecord& record) = 0;
  // Exit barrier: this node's workers all succeeded / did every node's?
  virtual void mark_done() = 0;
  virtual bool all_done() = 0;
  // This node knows the final outcome; the store host may stop waiting for it.
  virtual void acknowledge_end() = 0;
  // Before exit: the store host waits (close_timeout) for the acknowledgements,
  // so nobody loses the store before reading the outcome.
  virtual void finish(const Tick& tick) = 0;
};

std::unique_ptr<Rendezvous> make_rendezvous(const Options& options, const Tick& tick);

}  // namespace ddprun
