// The store rendezvous's round state (round_state.h).
#include "round_state.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <random>
#include <sstream>

#include "net.h"
#include "runtime/parse_number.h"

namespace ddprun {

std::vector<uint8_t> store_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string store_text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

RoundState::RoundState(std::string run_id, std::string where)
    : run_id_(std::move(run_id)), where_(std::move(where)), base_("ddprun/" + run_id_ + "/") {}

void RoundState::enter(c10d::TCPStore& store, int round) {
  const std::string round_at = round_key();
  if (store.check({round_at})) round = std::max(round, stored_number(store, round_at, 0, INT_MAX));
  number_ = round;
  replacing = false;
  store.set(round_at, store_bytes(std::to_string(round)));
}

std::string RoundState::node_line(int nproc) {
  return std::to_string(nproc) + " " + this_hostname() + " " + std::to_string(::getpid()) + " " +
         std::to_string(std::random_device{}());
}

std::string RoundState::host_in(const std::string& line) {
  std::istringstream in(line);
  std::string count, host;
  in >> count >> host;
  return host;
}

std::string RoundState::pid_in(const std::string& line) {
  std::istringstream in(line);
  std::string count, host, pid;
  in >> count >> host >> pid;
  return pid;
}

int RoundState::number_in(const std::string& key, const std::string& value, long long lo, long long hi) const {
  if (auto v = ddp::parse_integer(value, lo, hi)) return static_cast<int>(*v);
  throw foreign_value(key, value, "a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

int RoundState::stored_number(c10d::TCPStore& store, const std::string& key, long long lo, long long hi) const {
  return number_in(key, store_text(store.get(key)), lo, hi);
}

// Values in the store are ddprun's own; anything else means another program
// (or another ddprun version) shares this store and run id.
LaunchError RoundState::foreign_value(const std::string& key, const std::string& value,
                                      const std::string& expected) const {
  return LaunchError("the rendezvous store at " + where_ + " holds '" + value + "' under " + key + " where ddprun "
                     "expects " + expected + ": another program or ddprun version is using run '" + run_id_ +
                     "' there; give this run another --rdzv-id, or a store of its own");
}

}  // namespace ddprun
