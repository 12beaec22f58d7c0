// The c10d join of the store rendezvous (store_join.h): nodes are ranked by
// arrival; the group closes at MAX nodes, or last_call_timeout after MIN
// were in; a node that comes after it closed waits, counted on the round's
// waiting list, until the running nodes restart to admit it (torchrun's
// agents do the same).
#include <climits>

#include "errors.h"
#include "net.h"
#include "output.h"
#include "store_join.h"

namespace ddprun {
namespace {

class ArrivalJoin : public StoreJoin {
 public:
  explicit ArrivalJoin(const StoreConfig& config) : c_(config) {}

  StoreWording wording() const override {
    return {"--rdzv-endpoint", "--rdzv-endpoint", "port in --rdzv-endpoint", "the ddprun serving it"};
  }

  // One that comes after the round closed waits to be let in at a later one.
  void take_place(StoreLink& link, RoundState& round, const std::string& line, Clock::time_point started,
                  Clock::time_point deadline, const Tick& tick) override {
    c10d::TCPStore& store = link.store();
    for (;;) {
      int idx = static_cast<int>(store.add(round.joined(), 1)) - 1;
      int n = 0;
      if (closed_count(store, round, n) && idx >= n) {
        // The round runs already: take a lost node's place in it, or wait
        // to be let in at a later one.
        if (take_vacancy(store, round, n, line)) return;
        wait_for_admission(store, round, n, line, deadline, tick);
        continue;
      }
      store.set(round.node(idx), store_bytes(line));
      n = wait_for_close(store, round, started, deadline, tick);
      if (idx >= n) {
        wait_for_admission(store, round, n, line, deadline, tick);
        continue;
      }
      round.size = n;
      round.rank = idx;
      return;
    }
  }

  // The address of this node that the other nodes reach: --local-addr, or
  // the one that routes to the store, or the host name.
  std::string master_address() const override {
    std::string addr = c_.local_addr;
    if (addr.empty()) addr = local_address_toward(c_.host, static_cast<uint16_t>(c_.port));
    if (addr.empty()) addr = this_hostname();
    return addr;
  }

  // torchrun's rule: a healthy group below MAX lets waiting nodes in. Not
  // once a node's workers have all finished: that node is in its exit
  // barrier, and the run is about to end.
  std::optional<std::string> admission(c10d::TCPStore& watch, const RoundState& round) const override {
    if (round.size >= c_.max_nodes) return std::nullopt;
    const int64_t waiting = watch.add(round.waiting(), 0);
    if (waiting <= 0 || watch.add(round.done(), 0) != 0) return std::nullopt;
    return std::to_string(waiting) + (waiting == 1 ? " node waits" : " nodes wait") + " to join the " +
           std::to_string(round.size) + " running (at most " + std::to_string(c_.max_nodes) + ")";
  }

 private:
  bool closed_count(c10d::TCPStore& store, const RoundState& round, int& n) const {
    if (!store.check({round.closed()})) return false;
    n = round.stored_number(store, round.closed(), 1, c_.max_nodes);
    return true;
  }

  int wait_for_close(c10d::TCPStore& store, const RoundState& round, Clock::time_point started,
                     Clock::time_point deadline, const Tick& tick) const;
  bool vacancy_open(c10d::TCPStore& store, const RoundState& round, int n, const std::string& line) const;
  bool take_vacancy(c10d::TCPStore& store, RoundState& round, int n, const std::string& line) const;
  void wait_for_admission(c10d::TCPStore& store, RoundState& round, int n, const std::string& line,
                          Clock::time_point deadline, const Tick& tick) const;
  std::string nnodes() const { return "--nnodes " + std::to_string(c_.min_nodes) + ":" + std::to_string(c_.max_nodes); }
  std::string join_timeout_s() const { return std::to_string(static_cast<int>(c_.conf.join_timeout)); }

  const StoreConfig& c_;
};

// The group closes when MAX nodes are in, or last_call_timeout after MIN
// were: whoever sees that first writes the final count, and the
// compare-and-set makes that one decision binding for every node. Returns
// that count.
int ArrivalJoin::wait_for_close(c10d::TCPStore& store, const RoundState& round, Clock::time_point started,
                                Clock::time_point deadline, const Tick& tick) const {
  std::optional<Clock::time_point> min_reached;
  int joined = 0;
  int n = 0;
  auto closed = [&] {
    if (closed_count(store, round, n)) return true;
    joined = static_cast<int>(store.add(round.joined(), 0));
    int count = 0;
    if (joined >= c_.max_nodes) {
      count = c_.max_nodes;
    } else if (joined >= c_.min_nodes) {
      if (!min_reached) min_reached = Clock::now();
      if (Clock::now() - *min_reached >= seconds(c_.conf.last_call_timeout)) count = joined;
    }
    if (count == 0) return false;
    store.compareSet(round.closed(), {}, store_bytes(std::to_string(count)));
    return closed_count(store, round, n);
  };
  Notice waiting{started + kQuietJoin, [&] {
                   say("waiting for nodes to join run '" + c_.run_id + "' at " + round.where() + " (" +
                       std::to_string(joined) + " of " + std::to_string(c_.min_nodes) + "-" +
                       std::to_string(c_.max_nodes) + " so far)");
                 }};
  if (!wait_until(deadline, tick, kStorePoll, closed, waiting))
    throw LaunchError("only " + std::to_string(joined) + " of at least " + std::to_string(c_.min_nodes) +
                      " nodes joined run '" + c_.run_id + "' at " + round.where() + " within " + join_timeout_s() +
                      " s (" + std::to_string(c_.min_nodes - joined) + " missing); start ddprun on the other "
                      "nodes, or lower --nnodes MIN");
  return n;
}

// --recover-in-process: a node of the running round that was lost, with as
// many workers as this one (`line`'s count): its place, which a node takes
// by one compare-and-set.
bool ArrivalJoin::vacancy_open(c10d::TCPStore& store, const RoundState& round, int n, const std::string& line) const {
  if (!c_.recover_in_process) return false;
  const std::string count = line.substr(0, line.find(' ')) + " ";
  for (int i = 0; i < n; ++i)
    if (store.check({round.vacant(i)}) && store_text(store.get(round.vacant(i))) == RoundState::kVacant &&
        store_text(store.get(round.node(i))).rfind(count, 0) == 0)
      return true;
  return false;
}

bool ArrivalJoin::take_vacancy(c10d::TCPStore& store, RoundState& round, int n, const std::string& line) const {
  if (!vacancy_open(store, round, n, line)) return false;
  const std::string count = line.substr(0, line.find(' ')) + " ";
  for (int i = 0; i < n; ++i) {
    if (!store.check({round.vacant(i)}) || store_text(store.get(round.node(i))).rfind(count, 0) != 0) continue;
    if (store_text(store.compareSet(round.vacant(i), store_bytes(RoundState::kVacant), store_bytes(line))) != line)
      continue;  // not vacant, or another node took it first
    store.set(round.node(i), store_bytes(line));
    round.size = n;
    round.rank = i;
    round.replacing = true;
    return true;
  }
  return false;
}

// This node came after the round closed with n nodes: it is on that round's
// waiting list until the running nodes restart into the next round (which
// moves `round` there), a lost node's place opens (--recover-in-process),
// the run ends, or `deadline`.
void ArrivalJoin::wait_for_admission(c10d::TCPStore& store, RoundState& round, int n, const std::string& line,
                                     Clock::time_point deadline, const Tick& tick) const {
  store.add(round.waiting(), 1);
  const bool full = n >= c_.max_nodes;
  say(full ? "run '" + c_.run_id + "' runs with its maximum of " + std::to_string(n) + " nodes (" + nnodes() +
                 "); this node waits until one leaves (at most " + join_timeout_s() + " s, join_timeout)"
           : "run '" + c_.run_id + "' runs with " + std::to_string(n) + (n == 1 ? " node (" : " nodes (") +
                 nnodes() + "); this node waits to be admitted: the running nodes restart their workers at their "
                 "next check");
  int next = round.number();
  bool finished = false;
  std::string gone;
  bool vacancy = false;
  auto admitted = [&] {
    try {
      next = round.stored_number(store, round.round_key(), 0, INT_MAX);
      if (next > round.number()) return true;
      if ((vacancy = vacancy_open(store, round, n, line))) return true;
      finished = store.add(round.done(), 0) >= n;
      return finished;
    } catch (const LaunchError&) {
      throw;
    } catch (const std::exception& e) {
      // The store host leaves once its run has ended.
      gone = first_line(e.what());
      return true;
    }
  };
  if (!wait_until(deadline, tick, kStorePoll, admitted))
    throw LaunchError(full ? "run '" + c_.run_id + "' kept its maximum of " + std::to_string(n) + " nodes (" +
                                 nnodes() + ") for " + join_timeout_s() +
                                 " s (join_timeout) and this node found no place; raise MAX, or start it when a "
                                 "node has left"
                           : "run '" + c_.run_id + "' did not admit this node within " + join_timeout_s() +
                                 " s (join_timeout): its nodes did not restart; are they stopped?");
  if (finished)
    throw LaunchError("run '" + c_.run_id + "' finished while this node waited to join it; nothing left to do");
  if (!gone.empty())
    throw LaunchError("the rendezvous store at " + round.where() + " went away while this node waited to join run '" +
                      c_.run_id + "' (the run ended, or its store host stopped): " + gone);
  if (vacancy) {
    store.add(round.waiting(), -1);  // off the list: no restart to admit it
    return;
  }
  round.move_to(next);
}

}  // namespace

std::unique_ptr<StoreJoin> make_arrival_join(const StoreConfig& config) {
  return std::make_unique<ArrivalJoin>(config);
}

}  // namespace ddprun
