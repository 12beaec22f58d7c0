#include "store_rendezvous.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <climits>
#include <random>
#include <sstream>
#include <vector>

#include "errors.h"
#include "net.h"
#include "output.h"
#include "runtime/parse_number.h"
#include "comm/store/store_bind.h"
#include "comm/store/store_client.h"
#include "comm/store/store_deadline.h"
#include "signals.h"
#include "wait.h"

namespace ddprun {
namespace {

// How often a wait on the store looks again.
constexpr auto kStorePoll = std::chrono::milliseconds(100);
// How long a join waits quietly before saying what it waits for.
constexpr auto kQuietJoin = std::chrono::seconds(5);
// The longest one attempt to connect to the store may take: the attempts
// repeat until join_timeout, and tick() reads the signals between them.
constexpr auto kConnectAttempt = std::chrono::seconds(2);
// A silent store ends a join this long after join_timeout, so that a store
// that does answer reports what the join itself waited for.
constexpr auto kSilenceGrace = std::chrono::seconds(2);

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// c10d exceptions carry a C++ backtrace after the first line.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

class StoreRendezvous : public Rendezvous {
 public:
  StoreRendezvous(StoreConfig c, const Tick& tick) : c_(std::move(c)) { connect(tick); }

  Assignment join(int round, int local_world_size, const Tick& tick) override {
    watch_.reset();  // a fresh connection for each round's watching
    return answered("its answers while joining run '" + c_.run_id + "'",
                    Clock::now() + seconds(c_.conf.join_timeout) + kSilenceGrace, tick,
                    [&] { return do_join(round, local_world_size, tick); });
  }

  std::optional<FailureRecord> poll(bool admit) override {
    return guarded([&]() -> std::optional<FailureRecord> {
      if (watch().check({key("failed")})) return FailureRecord::parse(text(watch().get(key("failed"))));
      // torchrun's rule: a healthy group below MAX lets waiting nodes in.
      // Not once a node's workers have all finished: that node is in its exit
      // barrier, and the run is about to end.
      if (admit && c_.dynamic && n_ < c_.max_nodes) {
        if (const int64_t waiting = watch().add(key("waiting"), 0); waiting > 0 && watch().add(key("done"), 0) == 0) {
          FailureRecord r;
          r.exit_code = 0;
          r.membership = true;
          r.text = std::to_string(waiting) + (waiting == 1 ? " node waits" : " nodes wait") + " to join the " +
                   std::to_string(n_) + " running (at most " + std::to_string(c_.max_nodes) + ")";
          return do_report(r);
        }
      }
      auto now = Clock::now();
      if (now < next_keep_alive_) return std::nullopt;
      next_keep_alive_ = now + seconds(c_.conf.keep_alive_interval);
      watch().add(key("alive/" + std::to_string(me_)), 1);
      // A node whose ddprun died without a word (SIGKILL, power) stops
      // counting; after keep_alive_max_attempt intervals it is declared gone.
      for (int i = 0; i < n_; ++i) {
        if (i == me_ || !silent(i, now)) continue;
        ++gone_;  // it will never acknowledge the end either
        FailureRecord r;
        r.text = "node " + std::to_string(i) + " (" + hosts_[i] + ") sent no keep-alive for " +
                 std::to_string(static_cast<int>(c_.conf.keep_alive_interval * c_.conf.keep_alive_max_attempt)) +
                 " s; its ddprun is gone";
        return do_report(r);
      }
      return std::nullopt;
    });
  }

  FailureRecord report_failure(const FailureRecord& r) override {
    return guarded([&] { return do_report(r); });
  }

  void mark_done() override {
    guarded([&] { return watch().add(key("done"), 1); });
  }

  bool all_done() override {
    return guarded([&] { return watch().add(key("done"), 0) >= n_; });
  }

  void acknowledge_end() override {
    if (acknowledged_ || hosting_) return;
    acknowledged_ = true;
    try {
      // After a lost contact, one short attempt: not watch()'s wait of the
      // keep-alive limit (15 s by default) on a link that may still be down.
      auto o = options(false);
      o.timeout = kConnectAttempt;
      (lost_contact_ ? *ddp::store_client::connect_bounded(c_.host, o) : watch()).add(key("left"), 1);
    } catch (const std::exception&) {
      // The host is gone already; nobody is waiting for this acknowledgement.
    }
  }

  void finish(const Tick& tick) override {
    if (!hosting_) return;
    try {
      wait_until(Clock::now() + seconds(c_.conf.close_timeout), tick, kStorePoll,
                 [&] {
                   // A node silent past the keep-alive limit (its link or host
                   // is down) will not acknowledge: do not wait for it.
                   int quiet = 0;
                   for (int i = 0; i < n_; ++i) quiet += i != me_ && silent(i, Clock::now());
                   return store_->add(key("left"), 0) >= n_ - 1 - std::max(gone_, quiet);
                 });
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception&) {
      // The outcome is known here already; a store failing now changes nothing.
    }
  }

 private:
  std::string base() const { return "ddprun/" + c_.run_id + "/"; }
  std::string key(const std::string& k) const { return base() + "r" + std::to_string(round_) + "/" + k; }
  std::string where() const { return c_.host + ":" + std::to_string(c_.port); }

  // Whether node i's keep-alive count has not moved for keep_alive_interval x
  // keep_alive_max_attempt (reads it; call at most every few hundred ms).
  bool silent(int i, Clock::time_point now) {
    const int64_t v = watch().add(key("alive/" + std::to_string(i)), 0);
    if (v != alive_seen_[i]) {
      alive_seen_[i] = v;
      alive_changed_[i] = now;
      return false;
    }
    return now - alive_changed_[i] > seconds(c_.conf.keep_alive_interval * c_.conf.keep_alive_max_attempt);
  }

  c10d::TCPStore& watch() {
    if (hosting_) return *store_;  // in this process: no link to lose
    if (!watch_) {
      auto o = options(false);
      o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
          seconds(c_.conf.keep_alive_interval * c_.conf.keep_alive_max_attempt));
      // Every call on this connection gives up after o.timeout
      // (store_client.h): a call on a dead link would block for ever.
      watch_ = ddp::store_client::connect_bounded(c_.host, o);
      watch_->wait({"ddprun/run_id"}, o.timeout);
    }
    return *watch_;
  }

  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const LaunchError&) {
      throw;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      throw lost(e);
    }
  }

  LaunchError lost(const std::exception& e) {
    // A call that timed out may get its answer later, which the next call
    // on that connection would read as its own: never reuse it.
    watch_.reset();
    lost_contact_ = true;
    return LaunchError("lost contact with the rendezvous store at " + where() +
                       " (the node hosting it may have stopped): " + first_line(e.what()));
  }

  // Calls on store_ that another machine answers, ended by `deadline` or by a
  // termination signal even inside c10d's blocking recv (store_deadline.h),
  // and reported as what they are; `what` is what this node waited for.
  template <class F>
  auto answered(const std::string& what, Clock::time_point deadline, const Tick& tick, F&& f) -> decltype(f()) {
    if (hosting_) return guarded(f);  // served in this process: it answers
    ddp::store_deadline::Deadline bound(deadline, store_sockets_, &SignalChannel::termination_pending);
    try {
      return f();
    } catch (const LaunchError&) {
      throw;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      if (bound.ended() == ddp::store_deadline::Ended::Stop) tick();  // throws Interrupted
      // Ended by the Deadline, or by the sockets' own timeout (join_timeout).
      if (bound.ended() == ddp::store_deadline::Ended::Deadline || Clock::now() >= deadline - kSilenceGrace)
        throw silent(what);
      throw lost(e);
    }
  }

  // The store accepts connections but does not answer: its host is hung or
  // stopped, or the port is some other service's, or a firewall lets the
  // handshake through and nothing after it.
  LaunchError silent(const std::string& what, const std::string& detail = "") const {
    return LaunchError("the rendezvous store at " + where() + " did not answer within " +
                       std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (join_timeout) while this node "
                       "waited for " + what + (detail.empty() ? "" : " (" + detail + ")") + "; check that " +
                       (c_.dynamic ? "--rdzv-endpoint" : "--master-addr/--master-port") + " name the store, that " +
                       (c_.dynamic ? "the ddprun serving it" : "node 0's ddprun") +
                       " is running and not stopped, and that no firewall drops traffic to port " +
                       std::to_string(c_.port));
  }

  // TCPStore's constructor in attempts of kConnectAttempt at most (2.x's
  // pings the server and would wait on a silent one), signals read between.
  void connect_client(Clock::time_point deadline, const Tick& tick) {
    std::string last;
    auto connected = [&] {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return false;
      try {
        auto c = ddp::store_client::connect(
            c_.host, options(false),
            std::chrono::duration_cast<std::chrono::milliseconds>(std::min<Clock::duration>(left, kConnectAttempt)),
            &SignalChannel::termination_pending);
        store_ = c.store;
        store_sockets_ = c.sockets;
        return true;
      } catch (const std::exception& e) {
        last = first_line(e.what());
        return false;
      }
    };
    if (!wait_until(deadline, tick, kStorePoll, connected)) throw silent("its answer to a new connection", last);
  }

  c10d::TCPStoreOptions options(bool server) const {
    c10d::TCPStoreOptions o;  // only fields LibTorch 1.13 and 2.x both have
    o.port = static_cast<uint16_t>(c_.port);
    o.isServer = server;
    o.waitWorkers = false;
    o.multiTenant = false;
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(seconds(c_.conf.join_timeout));
    return o;
  }

  // What to change when this node cannot serve the store where it should.
  std::string fix_for(ddp::store_bind::ListenError::Kind kind) const {
    const std::string flag = c_.dynamic ? "--rdzv-endpoint" : "--master-addr";
    switch (kind) {
      case ddp::store_bind::ListenError::Kind::Unresolved:
        return "check " + flag + ": it must name the first node as every node resolves it";
      case ddp::store_bind::ListenError::Kind::NotLocal:
        return flag + " must be an address of the node that serves the store (this is host " + this_hostname() + ")";
      case ddp::store_bind::ListenError::Kind::InUse:
        return std::string("pick another ") + (c_.dynamic ? "port in --rdzv-endpoint" : "--master-port") +
               ", or stop the process that holds it";
      default:
        return "check " + flag;
    }
  }

  void connect(const Tick& tick) {
    auto deadline = Clock::now() + seconds(c_.conf.join_timeout);
    if (c_.host_store && c_.fall_back_to_client &&
        !port_unavailable_reason(static_cast<uint16_t>(c_.port)).empty()) {
      // Another ddprun on this machine serves the endpoint already; join it
      // (checked first so c10d's bind failure does not clutter the console).
      c_.host_store = false;
    }
    if (c_.host_store) {
      std::string why = port_unavailable_reason(static_cast<uint16_t>(c_.port));
      if (!why.empty())
        throw LaunchError("cannot host the rendezvous store on port " + std::to_string(c_.port) + " (" + why +
                          "); pick another --master-port, or stop the process that holds it");
      try {
        // On the endpoint's address only (store_bind.h).
        auto served = ddp::store_bind::serve_tcp_store(c_.host, options(true));
        if (!served.notice.empty()) say("rendezvous store: " + c_.host + " " + served.notice);
        store_ = served.store;
        hosting_ = true;
      } catch (const ddp::store_bind::ListenError& e) {
        if (!c_.fall_back_to_client || e.kind() != ddp::store_bind::ListenError::Kind::InUse)
          throw LaunchError("cannot host the rendezvous store at " + where() + ": " + e.what() + "; " +
                            fix_for(e.kind()));
      } catch (const std::exception& e) {
        if (!c_.fall_back_to_client)
          throw LaunchError("cannot host the rendezvous store at " + where() + ": " + first_line(e.what()));
      }
    }
    if (!store_) {
      // Our own interruptible wait first: TCPStore's connect loop would
      // ignore Ctrl-C for the whole join_timeout.
      std::string why;
      if (!wait_until_listening(c_.host, static_cast<uint16_t>(c_.port), deadline, tick, why))
        throw LaunchError("cannot reach the rendezvous store at " + where() + " within " +
                          std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (" + why + "); check " +
                          (c_.dynamic ? "--rdzv-endpoint" : "--master-addr/--master-port") +
                          ", that the first node is running ddprun, and that the port is open");
      connect_client(deadline, tick);
    }
    answered("its answer to the first request (the run id check)", deadline + kSilenceGrace, tick, [&] {
      std::string id = text(store_->compareSet("ddprun/run_id", {}, bytes(c_.run_id)));
      if (id != c_.run_id)
        throw LaunchError("the rendezvous store at " + where() + " belongs to run '" + id + "', not --rdzv-id '" +
                          c_.run_id + "': give every node the same --rdzv-id, or use another endpoint for a new run");
      std::string fp = text(store_->compareSet(base() + "settings", {}, bytes(c_.fingerprint)));
      if (fp != c_.fingerprint)
        throw LaunchError("this node's settings (" + c_.fingerprint + ") differ from run '" + c_.run_id + "' (" +
                          fp + "): start every node with the same --nnodes and --max-restarts");
      return 0;
    });
  }

  FailureRecord do_report(const FailureRecord& r) {
    return FailureRecord::parse(text(watch().compareSet(key("failed"), {}, bytes(r.serialize()))));
  }

  // Values in the store are ddprun's own; anything else means another
  // program (or another ddprun version) shares this store and run id.
  LaunchError foreign_value(const std::string& k, const std::string& value, const std::string& expected) const {
    return LaunchError("the rendezvous store at " + where() + " holds '" + value + "' under " + k + " where ddprun "
                       "expects " + expected + ": another program or ddprun version is using run '" + c_.run_id +
                       "' there; give this run another --rdzv-id, or a store of its own");
  }

  int number_in(const std::string& k, const std::string& value, long long lo, long long hi) const {
    if (auto v = ddp::parse_integer(value, lo, hi)) return static_cast<int>(*v);
    throw foreign_value(k, value, "a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }

  int stored_number(const std::string& k, long long lo, long long hi) {
    return number_in(k, text(store_->get(k)), lo, hi);
  }

  bool closed_count(int& n) {
    if (!store_->check({key("closed")})) return false;
    n = stored_number(key("closed"), 1, c_.max_nodes);
    return true;
  }

  // This node came after round round_ closed with n nodes: it is on that
  // round's waiting list until the running nodes restart into the next round
  // (which sets round_ here), the run ends, or `deadline`.
  void wait_for_admission(int n, Clock::time_point deadline, const Tick& tick) {
    store_->add(key("waiting"), 1);
    const std::string nnodes = "--nnodes " + std::to_string(c_.min_nodes) + ":" + std::to_string(c_.max_nodes);
    const bool full = n >= c_.max_nodes;
    say(full ? "run '" + c_.run_id + "' runs with its maximum of " + std::to_string(n) + " nodes (" + nnodes +
                   "); this node waits until one leaves (at most " +
                   std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s, join_timeout)"
             : "run '" + c_.run_id + "' runs with " + std::to_string(n) + (n == 1 ? " node (" : " nodes (") + nnodes +
                   "); this node waits to be admitted: the running nodes restart their workers at their next check");
    const std::string round_key = base() + "round";
    int next = round_;
    bool finished = false;
    std::string gone;
    auto admitted = [&] {
      try {
        next = stored_number(round_key, 0, INT_MAX);
        if (next > round_) return true;
        finished = store_->add(key("done"), 0) >= n;
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
      throw LaunchError(full ? "run '" + c_.run_id + "' kept its maximum of " + std::to_string(n) + " nodes (" + nnodes +
                                   ") for " + std::to_string(static_cast<int>(c_.conf.join_timeout)) +
                                   " s (join_timeout) and this node found no place; raise MAX, or start it when a "
                                   "node has left"
                             : "run '" + c_.run_id + "' did not admit this node within " +
                                   std::to_string(static_cast<int>(c_.conf.join_timeout)) +
                                   " s (join_timeout): its nodes did not restart; are they stopped?");
    if (finished)
      throw LaunchError("run '" + c_.run_id + "' finished while this node waited to join it; nothing left to do");
    if (!gone.empty())
      throw LaunchError("the rendezvous store at " + where() + " went away while this node waited to join run '" +
                        c_.run_id + "' (the run ended, or its store host stopped): " + gone);
    round_ = next;
  }

  Assignment do_join(int round, int nproc, const Tick& tick) {
    const auto started = Clock::now();
    const auto deadline = started + seconds(c_.conf.join_timeout);
    enter_round(round);
    const std::string me_info = std::to_string(nproc) + " " + this_hostname() + " " + std::to_string(::getpid()) +
                                " " + std::to_string(std::random_device{}());
    if (c_.dynamic)
      join_by_arrival(me_info, started, deadline, tick);
    else
      take_node_rank(me_info);
    const std::vector<std::string> node_keys = wait_for_every_node(started, deadline, tick);
    Assignment a = assignment_from(node_keys);
    agree_on_master(a, deadline, tick);
    gone_ = 0;
    lost_contact_ = false;  // this round's store answered
    alive_seen_.assign(n_, -1);
    alive_changed_.assign(n_, Clock::now());
    next_keep_alive_ = Clock::now();
    return a;
  }

  // A node arriving while the others restart joins their round.
  void enter_round(int round) {
    const std::string round_key = base() + "round";
    if (store_->check({round_key})) round = std::max(round, stored_number(round_key, 0, INT_MAX));
    round_ = round;
    store_->set(round_key, bytes(std::to_string(round)));
  }

  // Static rendezvous: this node is --node-rank of --nnodes, unless another
  // node has that rank already.
  void take_node_rank(const std::string& me_info) {
    n_ = c_.max_nodes;
    me_ = c_.node_rank;
    std::string got = text(store_->compareSet(key("node/" + std::to_string(me_)), {}, bytes(me_info)));
    if (got != me_info)
      throw LaunchError("node rank " + std::to_string(me_) + " of run '" + c_.run_id + "' is already taken (by " +
                        host_of(got) + "): give every node a different --node-rank");
  }

  // c10d rendezvous: nodes are ranked by arrival; one that comes after the
  // round closed waits to be let in at a later one.
  void join_by_arrival(const std::string& me_info, Clock::time_point started, Clock::time_point deadline,
                       const Tick& tick) {
    for (;;) {
      int idx = static_cast<int>(store_->add(key("joined"), 1)) - 1;
      int n = 0;
      if (closed_count(n) && idx >= n) {
        // The round runs already: wait to be let in at a later one.
        wait_for_admission(n, deadline, tick);
        continue;
      }
      store_->set(key("node/" + std::to_string(idx)), bytes(me_info));
      n = wait_for_close(started, deadline, tick);
      if (idx >= n) {
        wait_for_admission(n, deadline, tick);
        continue;
      }
      n_ = n;
      me_ = idx;
      return;
    }
  }

  // The group closes when MAX nodes are in, or last_call_timeout after MIN
  // were: whoever sees that first writes the final count, and the
  // compare-and-set makes that one decision binding for every node. Returns
  // that count.
  int wait_for_close(Clock::time_point started, Clock::time_point deadline, const Tick& tick) {
    std::optional<Clock::time_point> min_reached;
    int joined = 0;
    int n = 0;
    auto closed = [&] {
      if (closed_count(n)) return true;
      joined = static_cast<int>(store_->add(key("joined"), 0));
      int count = 0;
      if (joined >= c_.max_nodes) {
        count = c_.max_nodes;
      } else if (joined >= c_.min_nodes) {
        if (!min_reached) min_reached = Clock::now();
        if (Clock::now() - *min_reached >= seconds(c_.conf.last_call_timeout)) count = joined;
      }
      if (count == 0) return false;
      store_->compareSet(key("closed"), {}, bytes(std::to_string(count)));
      return closed_count(n);
    };
    Notice waiting{started + kQuietJoin, [&] {
                     say("waiting for nodes to join run '" + c_.run_id + "' at " + where() + " (" +
                         std::to_string(joined) + " of " + std::to_string(c_.min_nodes) + "-" +
                         std::to_string(c_.max_nodes) + " so far)");
                   }};
    if (!wait_until(deadline, tick, kStorePoll, closed, waiting))
      throw LaunchError("only " + std::to_string(joined) + " of at least " + std::to_string(c_.min_nodes) +
                        " nodes joined run '" + c_.run_id + "' at " + where() + " within " +
                        std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (" +
                        std::to_string(c_.min_nodes - joined) + " missing); start ddprun on the other "
                        "nodes, or lower --nnodes MIN");
    return n;
  }

  // Waits until every node of the round has written its line; returns the
  // keys of those lines, by node rank.
  std::vector<std::string> wait_for_every_node(Clock::time_point started, Clock::time_point deadline,
                                               const Tick& tick) {
    std::vector<std::string> node_keys;
    for (int i = 0; i < n_; ++i) node_keys.push_back(key("node/" + std::to_string(i)));
    Notice waiting{started + kQuietJoin,
                   [&] { say("waiting for the other nodes of run '" + c_.run_id + "' at " + where()); }};
    if (!wait_until(deadline, tick, kStorePoll, [&] { return store_->check(node_keys); }, waiting)) {
      std::string missing;
      for (int i = 0; i < n_; ++i)
        if (!store_->check({node_keys[i]})) missing += (missing.empty() ? "" : ",") + std::to_string(i);
      throw LaunchError("nodes " + missing + " of run '" + c_.run_id + "' did not join within " +
                        std::to_string(static_cast<int>(c_.conf.join_timeout)) +
                        " s; start ddprun on every node with the same --master-addr/--master-port");
    }
    return node_keys;
  }

  // Everyone's worker count, for WORLD_SIZE and this node's rank offset; the
  // hosts, for messages.
  Assignment assignment_from(const std::vector<std::string>& node_keys) {
    Assignment a;
    a.round = round_;
    a.group_rank = me_;
    a.num_nodes = n_;
    a.world_size = 0;
    hosts_.assign(n_, "");
    for (int i = 0; i < n_; ++i) {
      std::string info = text(store_->get(node_keys[i]));
      int count = number_in(node_keys[i], info.substr(0, info.find(' ')), 1, INT_MAX);
      hosts_[i] = host_of(info);
      a.nodes.push_back(hosts_[i] + "[" + pid_of(info) + "]");
      if (i < me_) a.rank_offset += count;
      a.world_size += count;
    }
    return a;
  }

  // Node 0 picks the workers' master port on its own machine and tells
  // the others; the store's port stays the store's.
  void agree_on_master(Assignment& a, Clock::time_point deadline, const Tick& tick) {
    std::string master_key = key("master");
    if (me_ == 0) {
      std::string addr = c_.master_addr;
      if (c_.dynamic) {
        addr = c_.local_addr;
        if (addr.empty()) addr = local_address_toward(c_.host, static_cast<uint16_t>(c_.port));
        if (addr.empty()) addr = this_hostname();
      }
      store_->set(master_key, bytes(addr + " " + std::to_string(free_port())));
    }
    if (!wait_until(deadline, tick, kStorePoll, [&] { return store_->check({master_key}); }))
      throw LaunchError("node 0 of run '" + c_.run_id + "' did not publish the workers' master address in time");
    std::string master = text(store_->get(master_key));  // "ADDRESS PORT"
    size_t space = master.find(' ');
    if (space == 0 || space == std::string::npos) throw foreign_value(master_key, master, "an address and a port");
    a.master_addr = master.substr(0, space);
    a.master_port = number_in(master_key, master.substr(space + 1), 1, 65535);
  }

  static std::string host_of(const std::string& info) {
    std::istringstream in(info);
    std::string count, host;
    in >> count >> host;
    return host;
  }

  static std::string pid_of(const std::string& info) {
    std::istringstream in(info);
    std::string count, host, pid;
    in >> count >> host >> pid;
    return pid;
  }

  StoreConfig c_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::vector<int> store_sockets_;  // store_'s, when another machine serves it
  // While the workers run: a second connection whose every call gives up
  // after keep_alive_interval x keep_alive_max_attempt (the time after which a
  // silent node counts as gone). store_'s calls may wait join_timeout (c10d
  // keeps the longest wait's socket timeout), and a link that went down must
  // not keep this node from noticing, and reporting, its own workers' failure.
  c10::intrusive_ptr<c10d::TCPStore> watch_;
  bool hosting_ = false;
  bool acknowledged_ = false;
  bool lost_contact_ = false;  // a call on the store failed (lost())
  int round_ = 0;
  int me_ = 0;
  int n_ = 1;
  int gone_ = 0;  // nodes declared dead this round
  std::vector<std::string> hosts_;
  std::vector<int64_t> alive_seen_;
  std::vector<Clock::time_point> alive_changed_;
  Clock::time_point next_keep_alive_{};
};

}  // namespace

std::unique_ptr<Rendezvous> make_store_rendezvous(StoreConfig config, const Tick& tick) {
  return std::make_unique<StoreRendezvous>(std::move(config), tick);
}

}  // namespace ddprun
