// The store rendezvous (store_rendezvous.h): the Rendezvous that the
// flavours share, around their join (store_join.h). The link to the store
// (store_link.h), the round's state and keys (round_state.h) and the
// keep-alive (keep_alive.h) are its parts.
#include "store_rendezvous.h"

#include <algorithm>
#include <climits>

#include "comm/recovery/recovery_keys.h"
#include "errors.h"
#include "keep_alive.h"
#include "net.h"
#include "output.h"
#include "round_state.h"
#include "store_join.h"
#include "store_link.h"
#include "wait.h"

namespace ddprun {
namespace {

class StoreRendezvous : public Rendezvous {
 public:
  StoreRendezvous(StoreConfig c, const Tick& tick)
      : c_(std::move(c)),
        join_(c_.dynamic ? make_arrival_join(c_) : make_static_join(c_)),
        link_(c_, join_->wording(), RoundState::run_id_key()),
        round_(c_.run_id, link_.where()),
        keep_alive_(link_, round_, c_.conf) {
    const auto deadline = Clock::now() + seconds(c_.conf.join_timeout);
    link_.connect(deadline, tick);
    check_run(deadline, tick);
  }

  Assignment join(int round, int local_world_size, const Tick& tick) override {
    link_.start_round();  // a fresh connection for each round's watching
    return link_.answered("its answers while joining run '" + c_.run_id + "'",
                          Clock::now() + seconds(c_.conf.join_timeout) + kSilenceGrace, tick,
                          [&] { return do_join(round, local_world_size, tick); });
  }

  std::optional<RoundEnd> poll(bool admit) override {
    return link_.guarded([&]() -> std::optional<RoundEnd> {
      c10d::TCPStore& watch = link_.watch();
      if (watch.check({round_.failed()})) return RoundEnd::parse(store_text(watch.get(round_.failed())));
      if (admit)
        if (auto why = join_->admission(watch, round_)) return report(RoundEnd::admission(*why));
      const auto now = Clock::now();
      if (!keep_alive_.beat(now)) return std::nullopt;
      // A node whose ddprun died without a word (SIGKILL, power) stops
      // counting; after keep_alive_max_attempt intervals it is declared gone.
      for (int i = 0; i < round_.size; ++i) {
        if (gone_nodes_[static_cast<size_t>(i)] && c_.recover_in_process) take_back(watch, i, now);
        if (i == round_.rank || gone_nodes_[static_cast<size_t>(i)] || !keep_alive_.lapsed(i, now)) continue;
        ++gone_;  // it will never acknowledge the end either
        gone_nodes_[static_cast<size_t>(i)] = true;
        if (c_.recover_in_process) {
          lose_node(watch, i);
          continue;
        }
        const std::string why = "node " + std::to_string(i) + " (" + round_.hosts[i] + ") sent no keep-alive for " +
                                std::to_string(keep_alive_.limit_s()) + " s; its ddprun is gone";
        return report(RoundEnd::failure(1, true, why));
      }
      return std::nullopt;
    });
  }

  RoundEnd report_failure(const RoundEnd& failure) override {
    return link_.guarded([&] { return report(failure); });
  }

  std::optional<std::string> lost_reason(int round, int rank) override {
    return link_.guarded([&]() -> std::optional<std::string> {
      c10d::TCPStore& watch = link_.watch();
      const std::string key = ddp::recovery_keys::lost(round, rank);
      if (!watch.check({key})) return std::nullopt;
      return store_text(watch.get(key));
    });
  }

  int64_t lost_count(int round) override {
    return link_.guarded([&] { return link_.watch().add(ddp::recovery_keys::lost_count(round), 0); });
  }

  void forget_joining(int round, int rank) override {
    link_.guarded([&] { return link_.watch().deleteKey(ddp::recovery_keys::joining(round, rank)); });
  }

  bool still_joining(int round, int rank) override {
    return link_.guarded([&] { return link_.watch().check({ddp::recovery_keys::joining(round, rank)}); });
  }

  void note_finished(int workers) override {
    link_.guarded([&] { return link_.watch().add(round_.finished(), workers); });
  }

  int finished_anywhere() override {
    return static_cast<int>(link_.guarded([&] { return link_.watch().add(round_.finished(), 0); }));
  }

  void report_lost_worker(int round, int rank, const std::string& why) override {
    link_.guarded([&] {
      c10d::TCPStore& watch = link_.watch();
      watch.set(ddp::recovery_keys::lost(round, rank), store_bytes(why));
      return watch.add(ddp::recovery_keys::lost_count(round), 1);
    });
  }

  void mark_done() override {
    link_.guarded([&] { return link_.watch().add(round_.done(), 1); });
  }

  bool all_done() override {
    // A node gone under --recover-in-process never marks itself done.
    return link_.guarded([&] { return link_.watch().add(round_.done(), 0) >= round_.size - gone_; });
  }

  void acknowledge_end() override {
    if (acknowledged_ || link_.hosting()) return;
    acknowledged_ = true;
    try {
      link_.add_once(round_.left());
    } catch (const std::exception&) {
      // The host is gone already; nobody is waiting for this acknowledgement.
    }
  }

  void finish(const Tick& tick) override {
    if (!link_.hosting()) return;
    try {
      wait_until(Clock::now() + seconds(c_.conf.close_timeout), tick, kStorePoll, [&] {
        // A node silent past the keep-alive limit (its link or host is
        // down) will not acknowledge: do not wait for it.
        const int quiet = keep_alive_.lapsed_others();
        return link_.store().add(round_.left(), 0) >= round_.size - 1 - std::max(gone_, quiet);
      });
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception&) {
      // The outcome is known here already; a store failing now changes nothing.
    }
  }

 private:
  // The store's first request: it serves this run, with these settings.
  void check_run(Clock::time_point deadline, const Tick& tick) {
    link_.answered("its answer to the first request (the run id check)", deadline + kSilenceGrace, tick, [&] {
      c10d::TCPStore& store = link_.store();
      std::string id = store_text(store.compareSet(RoundState::run_id_key(), {}, store_bytes(c_.run_id)));
      if (id != c_.run_id)
        throw LaunchError("the rendezvous store at " + link_.where() + " belongs to run '" + id +
                          "', not --rdzv-id '" + c_.run_id +
                          "': give every node the same --rdzv-id, or use another endpoint for a new run");
      std::string fp = store_text(store.compareSet(round_.settings_key(), {}, store_bytes(c_.fingerprint)));
      if (fp != c_.fingerprint)
        throw LaunchError("this node's settings (" + c_.fingerprint + ") differ from run '" + c_.run_id + "' (" +
                          fp + "): start every node with the same --nnodes and --max-restarts");
      return 0;
    });
  }

  // --recover-in-process: node i went silent; its workers are lost to the
  // others, who re-form without them, and the round goes on.
  void lose_node(c10d::TCPStore& watch, int i) {
    // Another node took its place before this one saw it lapse (the nodes
    // look a keep-alive interval apart): that one counts once it beats.
    const std::string line = store_text(watch.get(round_.node(i)));
    if (line != node_lines_[static_cast<size_t>(i)]) return;
    const std::string why = "node " + std::to_string(i) + " (" + round_.hosts[static_cast<size_t>(i)] +
                            ") sent no keep-alive for " + std::to_string(keep_alive_.limit_s()) + " s";
    mark_lost(watch, i, why);
    // Its place opens to a node that arrives later (arrival_join.cpp); a
    // node that took it before and is lost now opens it again.
    const std::string was = watch.check({round_.vacant(i)}) ? store_text(watch.get(round_.vacant(i))) : "";
    if (was.empty() || was == line)
      watch.compareSet(round_.vacant(i), store_bytes(was), store_bytes(RoundState::kVacant));
    say(why + "; its workers are lost and the others go on without them (--recover-in-process)");
  }

  // Node i's workers lost to the others, and none of them to be taken in.
  void mark_lost(c10d::TCPStore& watch, int i, const std::string& why) {
    const auto [first, count] = node_ranks_[static_cast<size_t>(i)];
    for (int r = first; r < first + count; ++r) {
      watch.set(ddp::recovery_keys::lost(round_.number(), r), store_bytes(why));
      watch.deleteKey(ddp::recovery_keys::joining(round_.number(), r));
    }
    watch.add(ddp::recovery_keys::lost_count(round_.number()), 1);
  }

  // A node took lost node i's place (vacant/<i> holds its line) and beats
  // its keep-alive: it counts again, its workers joining the others.
  // One that took it and never beat within the keep-alive limit is lost in
  // turn, and the place opens again.
  void take_back(c10d::TCPStore& watch, int i, Clock::time_point now) {
    if (!watch.check({round_.vacant(i)})) return;
    const std::string line = store_text(watch.get(round_.vacant(i)));
    auto& claim = claims_[static_cast<size_t>(i)];
    if (line == RoundState::kVacant) return;
    if (keep_alive_.lapsed(i, now)) {
      if (claim.first != line) claim = {line, now};
      if (now - claim.second < seconds(keep_alive_.limit_s())) return;
      mark_lost(watch, i, "the node that took node " + std::to_string(i) + "'s place sent no keep-alive");
      watch.compareSet(round_.vacant(i), store_bytes(line), store_bytes(RoundState::kVacant));
      return;
    }
    node_lines_[static_cast<size_t>(i)] = line;
    gone_nodes_[static_cast<size_t>(i)] = false;
    --gone_;
    round_.hosts[static_cast<size_t>(i)] = RoundState::host_in(line);
    say("node " + std::to_string(i) + " (" + round_.hosts[static_cast<size_t>(i)] + ") took the lost node's "
        "place; its workers join the others (--recover-in-process)");
  }

  // Writes `end` unless another node's came first; returns the winner.
  RoundEnd report(const RoundEnd& end) {
    return RoundEnd::parse(store_text(link_.watch().compareSet(round_.failed(), {}, store_bytes(end.serialize()))));
  }

  Assignment do_join(int round, int nproc, const Tick& tick) {
    const auto started = Clock::now();
    const auto deadline = started + seconds(c_.conf.join_timeout);
    round_.enter(link_.store(), round);
    join_->take_place(link_, round_, RoundState::node_line(nproc), started, deadline, tick);
    wait_for_every_node(started, deadline, tick);
    Assignment a = assignment();
    a.replacing = round_.replacing;
    agree_on_master(a, deadline, tick);
    a.store_host = c_.host;
    a.store_port = c_.port;
    gone_ = 0;
    gone_nodes_.assign(static_cast<size_t>(round_.size), false);
    claims_.assign(static_cast<size_t>(round_.size), {});
    link_.contact_restored();  // this round's store answered
    keep_alive_.start();
    return a;
  }

  // Waits until every node of the round has written its line.
  void wait_for_every_node(Clock::time_point started, Clock::time_point deadline, const Tick& tick) {
    c10d::TCPStore& store = link_.store();
    std::vector<std::string> node_keys;
    for (int i = 0; i < round_.size; ++i) node_keys.push_back(round_.node(i));
    Notice waiting{started + kQuietJoin,
                   [&] { say("waiting for the other nodes of run '" + c_.run_id + "' at " + link_.where()); }};
    if (wait_until(deadline, tick, kStorePoll, [&] { return store.check(node_keys); }, waiting)) return;
    std::string missing;
    for (int i = 0; i < round_.size; ++i)
      if (!store.check({node_keys[i]})) missing += (missing.empty() ? "" : ",") + std::to_string(i);
    throw LaunchError("nodes " + missing + " of run '" + c_.run_id + "' did not join within " +
                      std::to_string(static_cast<int>(c_.conf.join_timeout)) +
                      " s; start ddprun on every node with the same --master-addr/--master-port");
  }

  // Everyone's worker count, for WORLD_SIZE and this node's rank offset; the
  // hosts, for messages.
  Assignment assignment() {
    Assignment a;
    a.round = round_.number();
    a.group_rank = round_.rank;
    a.num_nodes = round_.size;
    a.world_size = 0;
    node_ranks_.clear();
    node_lines_.assign(static_cast<size_t>(round_.size), "");
    round_.hosts.assign(round_.size, "");
    for (int i = 0; i < round_.size; ++i) {
      const std::string key = round_.node(i);
      std::string line = store_text(link_.store().get(key));
      node_lines_[static_cast<size_t>(i)] = line;
      int count = round_.number_in(key, line.substr(0, line.find(' ')), 1, INT_MAX);
      round_.hosts[i] = RoundState::host_in(line);
      a.nodes.push_back(round_.hosts[i] + "[" + RoundState::pid_in(line) + "]");
      if (i < round_.rank) a.rank_offset += count;
      node_ranks_.push_back({a.world_size, count});
      a.world_size += count;
    }
    return a;
  }

  // Node 0 picks the workers' master port on its own machine and tells the
  // others; the store's port stays the store's.
  void agree_on_master(Assignment& a, Clock::time_point deadline, const Tick& tick) {
    c10d::TCPStore& store = link_.store();
    const std::string master_key = round_.master();
    if (round_.rank == 0 && !round_.replacing)
      store.set(master_key, store_bytes(join_->master_address() + " " + std::to_string(free_port())));
    if (!wait_until(deadline, tick, kStorePoll, [&] { return store.check({master_key}); }))
      throw LaunchError("node 0 of run '" + c_.run_id + "' did not publish the workers' master address in time");
    std::string master = store_text(store.get(master_key));  // "ADDRESS PORT"
    size_t space = master.find(' ');
    if (space == 0 || space == std::string::npos)
      throw round_.foreign_value(master_key, master, "an address and a port");
    a.master_addr = master.substr(0, space);
    a.master_port = round_.number_in(master_key, master.substr(space + 1), 1, 65535);
  }

  StoreConfig c_;
  std::unique_ptr<StoreJoin> join_;
  StoreLink link_;
  RoundState round_;
  KeepAlive keep_alive_;
  bool acknowledged_ = false;
  int gone_ = 0;  // nodes declared gone this round
  std::vector<bool> gone_nodes_;
  std::vector<std::pair<int, int>> node_ranks_;  // each node's first rank and worker count
  std::vector<std::string> node_lines_;           // each node's line, as this node last accepted it
  // --recover-in-process: a line that took a lost node's place, and since
  // when it has been seen without a keep-alive.
  std::vector<std::pair<std::string, Clock::time_point>> claims_;
};

}  // namespace

std::unique_ptr<Rendezvous> make_store_rendezvous(StoreConfig config, const Tick& tick) {
  return std::make_unique<StoreRendezvous>(std::move(config), tick);
}

}  // namespace ddprun
