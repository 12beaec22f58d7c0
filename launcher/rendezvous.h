// How the nodes of a run find each other and agree on who is who.
//
// Three implementations:
//   LocalRendezvous   one node (static --nnodes 1, --standalone): no store.
//   StoreRendezvous   several nodes over a c10d::TCPStore (store_rendezvous.h),
//                     in two flavours, each a join of its own (store_join.h):
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
// After the join the store carries the run's fate: the round's end (first
// writer wins), keep-alive counters, and the exit barrier. docs/launcher.md
// lists the keys.
#pragma once

#include <cstdint>
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
  // The rendezvous store's endpoint, which --recover-in-process gives the
  // workers as theirs (empty without a store).
  std::string store_host;
  int store_port = 0;
  // Every node of the group in node-rank order, as "host[ddprun pid]": what
  // a membership change compares (membership.h).
  std::vector<std::string> nodes;
  // --recover-in-process: this node took a lost node's place in the running
  // round; its workers join the others (DDPRUN_REPLACEMENT=1).
  bool replacing = false;
};

// How a round ended, as the store carries it to every node: the first one
// written is the one every node follows.
struct RoundEnd {
  enum class Kind {
    Failure,    // a worker, a node or its ddprun failed: restart, or give up
    Admission,  // not a failure: nodes wait to join a group below MAX (c10d);
                // every node stops its workers and re-rendezvouses, and no
                // restart is counted
  };
  Kind kind = Kind::Failure;
  int exit_code = 1;
  bool restartable = true;  // false when ddprun was told to stop, or a restart would fail alike
  std::string text;         // "rank 3 (local rank 1) on host h: exit code 7"
  std::string message;      // the worker's error file's message ("ddp::CommError: ..."), if any
  static constexpr size_t kMaxMessage = 4096;  // what travels through the store

  static RoundEnd failure(int exit_code, bool restartable, std::string text);
  // `why`: which nodes wait ("1 node waits to join the 2 running (at most 3)").
  static RoundEnd admission(std::string why);
  bool admits_nodes() const { return kind == Kind::Admission; }
  std::string serialize() const;
  // Never throws: whatever the store holds reads as some round end.
  static RoundEnd parse(const std::string& text);
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
  // returns the round's end once any node has written one. With `admit` (the
  // group runs healthy), nodes waiting to join below MAX end the round with
  // an admission (RoundEnd::Kind::Admission) that every node follows.
  // Throws LaunchError when the store is lost.
  virtual std::optional<RoundEnd> poll(bool admit) = 0;
  // Writes `failure` unless another node's round end came first; returns the
  // winner, which may be an admission.
  virtual RoundEnd report_failure(const RoundEnd& failure) = 0;
  // --recover-in-process: the worker of `rank` in `round` ended and the
  // others go on; the workers, watching the store, re-form without it
  // (src/comm/recovery/recovery_keys.h). Throws LaunchError when the store
  // is lost.
  virtual void report_lost_worker(int round, int rank, const std::string& why) = 0;
  // Why the workers declared the worker of `rank` lost (its heartbeat
  // stopped), if they did: ddprun then ends it.
  virtual std::optional<std::string> lost_reason(int round, int rank) = 0;
  // How many workers were reported lost in `round` so far: it moves with
  // every lost/ key written, so lost_reason() is worth asking only then.
  virtual int64_t lost_count(int round) = 0;
  // Whether the replacement of `rank` still waits to be taken in.
  virtual bool still_joining(int round, int rank) = 0;
  // A replacement lost while it waited: the others must not take it in.
  virtual void forget_joining(int round, int rank) = 0;
  // --recover-in-process: this node's workers that finished (exit 0), before
  // mark_done(); the count over every node, once all_done().
  virtual void note_finished(int workers) = 0;
  virtual int finished_anywhere() = 0;
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
