// Ends a TCPStore call that a silent peer would hold for ever. A store host
// that accepted the connection and then went quiet (hung, SIGSTOPped: the
// kernel still completes connections into its backlog, a firewall dropping
// packets after the handshake) leaves c10d's client blocked in recv(), where
// neither a deadline nor a signal reaches it: c10d retries on EINTR, and
// 2.x's constructor pings the server with no receive timeout at all.
//
// While a Deadline lives, a helper thread watches the clock and a `stop` test
// (ddprun: "a termination signal is pending"); when either comes, it shuts
// down (shutdown(2)) the sockets it was given and every socket the process
// opened since the Deadline began — and goes on shutting down new ones until
// the Deadline ends, because 2.x's constructor reconnects and pings again
// until its own timeout. The blocked call then fails at once; the connection
// is unusable after that, and the caller drops it. ended() says why.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ddp::store_deadline {

using Clock = std::chrono::steady_clock;

// This process's sockets: fd -> "socket:[inode]" (an fd number reused for
// another socket counts as new).
using Sockets = std::map<int, std::string>;
Sockets sockets_now();
// The same for the fds whose link begins with `kind` ("pipe:", "socket:").
Sockets fds_now(const std::string& kind);
// The fds in fds_now(kind) that `before` does not hold.
std::vector<int> opened_since(const Sockets& before, const std::string& kind = "socket:");

enum class Ended { No, Deadline, Stop };

class Deadline {
 public:
  // Watches until destruction; `stop` (may be empty) is asked every 50 ms
  // from the helper thread.
  Deadline(Clock::time_point at, std::vector<int> sockets, std::function<bool()> stop = {});
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  Ended ended() const;

 private:
  void watch();
  void shut_down();

  const Clock::time_point at_;
  const std::vector<int> sockets_;
  const std::function<bool()> stop_;
  const Sockets before_;
  bool shut_given_ = false;
  std::set<std::pair<int, std::string>> shut_;  // (fd, socket id) already shut down
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  Ended ended_ = Ended::No;
  std::thread thread_;
};

}  // namespace ddp::store_deadline
