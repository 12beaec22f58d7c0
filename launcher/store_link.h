// The store rendezvous's link to its c10d::TCPStore: serving it on this node
// or connecting to the node that does, the bounded connection that watches
// the round while the workers run, and every store exception turned into a
// LaunchError that says what went wrong and what to check.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "comm/store/store_deadline.h"
#include "errors.h"
#include "signals.h"
#include "store_rendezvous.h"
#include "wait.h"

namespace ddprun {

// How the store's messages name what to check: the flavours take the store's
// address from different flags (store_join.h gives each flavour's).
struct StoreWording {
  std::string endpoint;  // the flags that name the store: "--master-addr/--master-port"
  std::string address;   // the flag with the address this node must own to serve it
  std::string port;      // where its port is given
  std::string server;    // who serves it: "node 0's ddprun"
};

// How often a wait on the store looks again.
inline constexpr auto kStorePoll = std::chrono::milliseconds(100);
// A silent store ends a join this long after join_timeout, so that a store
// that does answer reports what the join itself waited for.
inline constexpr auto kSilenceGrace = std::chrono::seconds(2);

// c10d exceptions carry a C++ backtrace after the first line.
std::string first_line(const std::string& s);

class StoreLink {
 public:
  // `ready_key`: a key every store of the run holds once a node has
  // connected, which a new watching connection waits for.
  StoreLink(const StoreConfig& config, StoreWording wording, std::string ready_key);

  // Serves the store here (host_store) or connects to it, until `deadline`
  // (join_timeout); tick() reads the signals between attempts.
  void connect(Clock::time_point deadline, const Tick& tick);

  // The connection the join uses; its calls may wait join_timeout.
  c10d::TCPStore& store() { return *store_; }
  // The connection that watches the round while the workers run (the store
  // itself on its host): its every call gives up after the keep-alive limit.
  c10d::TCPStore& watch();
  bool hosting() const { return hosting_; }
  const std::string& where() const { return where_; }

  // A new round watches on a fresh connection.
  void start_round() { watch_.reset(); }
  // The store answered a whole join: contact is back.
  void contact_restored() { lost_contact_ = false; }
  // Adds one at `key` once, on the way out: after a lost contact in one
  // short attempt, not watch()'s wait of the keep-alive limit on a link that
  // may still be down. Throws what the store throws.
  void add_once(const std::string& key);

  // Runs f, whose store calls failing mean the store is lost (lost()).
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

  // Calls on store() that another machine answers, ended by `deadline` or by
  // a termination signal even inside c10d's blocking recv (store_deadline.h),
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
        throw store_not_answering(what);
      throw lost(e);
    }
  }

  // The store failed a call: the link or its host is down.
  LaunchError lost(const std::exception& e);
  // The store accepts connections but does not answer within join_timeout.
  LaunchError store_not_answering(const std::string& what, const std::string& detail = "") const;

 private:
  void serve_or_join(Clock::time_point deadline, const Tick& tick);
  void serve();
  void connect_client(Clock::time_point deadline, const Tick& tick);
  c10d::TCPStoreOptions options(bool server) const;

  const StoreConfig& c_;
  const StoreWording wording_;
  const std::string ready_key_;
  const std::string where_;  // "host:port", for messages
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::vector<int> store_sockets_;  // store_'s, when another machine serves it
  // While the workers run: a second connection whose every call gives up
  // after keep_alive_interval x keep_alive_max_attempt (the time after which a
  // silent node counts as gone). store_'s calls may wait join_timeout (c10d
  // keeps the longest wait's socket timeout), and a link that went down must
  // not keep this node from noticing, and reporting, its own workers' failure.
  c10::intrusive_ptr<c10d::TCPStore> watch_;
  bool hosting_ = false;
  bool lost_contact_ = false;  // a call on the store failed (lost())
};

}  // namespace ddprun
