// The store rendezvous's link to its TCPStore (store_link.h).
#include "store_link.h"

#include <algorithm>

#include "comm/store/store_bind.h"
#include "comm/store/store_client.h"
#include "net.h"
#include "output.h"

namespace ddprun {
namespace {

// The longest one attempt to connect to the store may take: the attempts
// repeat until join_timeout, and tick() reads the signals between them.
constexpr auto kConnectAttempt = std::chrono::seconds(2);

// What to change when this node cannot serve the store where it should.
std::string fix_for(const StoreWording& names, ddp::store_bind::ListenError::Kind kind) {
  switch (kind) {
    case ddp::store_bind::ListenError::Kind::Unresolved:
      return "check " + names.address + ": it must name the first node as every node resolves it";
    case ddp::store_bind::ListenError::Kind::NotLocal:
      return names.address + " must be an address of the node that serves the store (this is host " +
             this_hostname() + ")";
    case ddp::store_bind::ListenError::Kind::InUse:
      return "pick another " + names.port + ", or stop the process that holds it";
    default:
      return "check " + names.address;
  }
}

}  // namespace

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

StoreLink::StoreLink(const StoreConfig& config, StoreWording wording, std::string ready_key)
    : c_(config),
      wording_(std::move(wording)),
      ready_key_(std::move(ready_key)),
      where_(config.host + ":" + std::to_string(config.port)) {}

void StoreLink::connect(Clock::time_point deadline, const Tick& tick) {
  if (c_.host_store && c_.fall_back_to_client) {
    serve_or_join(deadline, tick);
  } else if (c_.host_store) {
    serve();
  }
  if (store_) return;
  // Our own interruptible wait first: TCPStore's connect loop would ignore
  // Ctrl-C for the whole join_timeout.
  std::string why;
  if (!wait_until_listening(c_.host, static_cast<uint16_t>(c_.port), deadline, tick, why))
    throw LaunchError("cannot reach the rendezvous store at " + where_ + " within " +
                      std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (" + why + "); check " +
                      wording_.endpoint + ", that the first node is running ddprun, and that the port is open");
  connect_client(deadline, tick);
}

// torchrun's rule for the endpoint's own node: serve the store, or join the
// ddprun on this machine that serves it already (checked first, so that
// c10d's bind failure does not clutter the console). A port taken while
// nothing listens on it (a closed connection's TIME_WAIT holds a port for a
// minute; an endpoint port inside the ephemeral range meets that) is waited
// for until it frees or someone serves it, never taken for a store that
// nobody serves.
void StoreLink::serve_or_join(Clock::time_point deadline, const Tick& tick) {
  const auto port = static_cast<uint16_t>(c_.port);
  std::string why_not_listening, why_taken;
  bool noticed = false;
  auto settled = [&] {
    if (accepts_connections(c_.host, port, why_not_listening)) return true;  // another ddprun serves it
    why_taken = port_unavailable_reason(port);
    if (why_taken.empty()) {
      serve();  // a bind lost to another ddprun leaves store_ unset: it listens at the next look
      return store_ != nullptr;
    }
    if (!noticed) {
      say("rendezvous store: port " + std::to_string(port) + " is taken (" + why_taken +
          ") and nothing listens on it; waiting until it frees (a closed connection's TIME_WAIT holds a port up "
          "to 60 s) or another ddprun here serves it");
      noticed = true;
    }
    return false;
  };
  if (!wait_until(deadline, tick, kStorePoll, settled))
    throw LaunchError("cannot host the rendezvous store at " + where_ + ": port " + std::to_string(port) +
                      " stayed taken (" + why_taken + ") with nothing listening on it for " +
                      std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (join_timeout); choose an " +
                      wording_.endpoint + " port outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range)" +
                      " or find the process that holds it (ss -tanp)");
}

// Serves the store on the endpoint's address only (store_bind.h). With
// fall_back_to_client, a port taken meanwhile leaves store_ unset: this node
// then connects as a client.
void StoreLink::serve() {
  std::string why = port_unavailable_reason(static_cast<uint16_t>(c_.port));
  if (!why.empty())
    throw LaunchError("cannot host the rendezvous store on port " + std::to_string(c_.port) + " (" + why +
                      "); pick another --master-port, or stop the process that holds it");
  try {
    auto served = ddp::store_bind::serve_tcp_store(c_.host, options(true));
    if (!served.notice.empty()) say("rendezvous store: " + c_.host + " " + served.notice);
    store_ = served.store;
    hosting_ = true;
  } catch (const ddp::store_bind::ListenError& e) {
    if (!c_.fall_back_to_client || e.kind() != ddp::store_bind::ListenError::Kind::InUse)
      throw LaunchError("cannot host the rendezvous store at " + where_ + ": " + e.what() + "; " +
                        fix_for(wording_, e.kind()));
  } catch (const std::exception& e) {
    if (!c_.fall_back_to_client)
      throw LaunchError("cannot host the rendezvous store at " + where_ + ": " + first_line(e.what()));
  }
}

// TCPStore's constructor in attempts of kConnectAttempt at most (2.x's
// pings the server and would wait on a silent one), signals read between.
void StoreLink::connect_client(Clock::time_point deadline, const Tick& tick) {
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
  if (!wait_until(deadline, tick, kStorePoll, connected))
    throw store_not_answering("its answer to a new connection", last);
}

c10d::TCPStoreOptions StoreLink::options(bool server) const {
  c10d::TCPStoreOptions o;  // only fields LibTorch 1.13 and 2.x both have
  o.port = static_cast<uint16_t>(c_.port);
  o.isServer = server;
  o.waitWorkers = false;
  o.multiTenant = false;
  o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(seconds(c_.conf.join_timeout));
  return o;
}

c10d::TCPStore& StoreLink::watch() {
  if (hosting_) return *store_;  // in this process: no link to lose
  if (!watch_) {
    auto o = options(false);
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        seconds(c_.conf.keep_alive_interval * c_.conf.keep_alive_max_attempt));
    // Every call on this connection gives up after o.timeout
    // (store_client.h): a call on a dead link would block for ever.
    watch_ = ddp::store_client::connect_bounded(c_.host, o);
    watch_->wait({ready_key_}, o.timeout);
  }
  return *watch_;
}

void StoreLink::add_once(const std::string& key) {
  if (!lost_contact_) {
    watch().add(key, 1);
    return;
  }
  auto o = options(false);
  o.timeout = kConnectAttempt;
  ddp::store_client::connect_bounded(c_.host, o)->add(key, 1);
}

LaunchError StoreLink::lost(const std::exception& e) {
  // A call that timed out may get its answer later, which the next call on
  // that connection would read as its own: never reuse it.
  watch_.reset();
  lost_contact_ = true;
  return LaunchError("lost contact with the rendezvous store at " + where_ +
                     " (the node hosting it may have stopped): " + first_line(e.what()));
}

// The store accepts connections but does not answer: its host is hung or
// stopped, or the port is some other service's, or a firewall lets the
// handshake through and nothing after it.
LaunchError StoreLink::store_not_answering(const std::string& what, const std::string& detail) const {
  return LaunchError("the rendezvous store at " + where_ + " did not answer within " +
                     std::to_string(static_cast<int>(c_.conf.join_timeout)) + " s (join_timeout) while this node "
                     "waited for " + what + (detail.empty() ? "" : " (" + detail + ")") + "; check that " +
                     wording_.endpoint + " name the store, that " + wording_.server +
                     " is running and not stopped, and that no firewall drops traffic to port " +
                     std::to_string(c_.port));
}

}  // namespace ddprun
