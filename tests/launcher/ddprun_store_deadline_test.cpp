// ddprun against a rendezvous store that never answers: a TCP endpoint that
// accepts connections and stays silent (as a hung store host does, or one
// that was SIGSTOPped: the kernel still completes connections into its
// backlog). ddprun must give up at join_timeout with a message naming the
// endpoint, and end at once on SIGINT/SIGTERM while it waits. A regression
// hangs; Process::wait's generous limit kills it and fails the test.
#include <poll.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

// Listens on 127.0.0.1 (a free port), accepts every connection and holds it
// open without reading or writing a byte.
class SilentEndpoint {
 public:
  SilentEndpoint() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "cannot listen on loopback";
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listener_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        std::lock_guard<std::mutex> lock(mutex_);
        held_.push_back(fd);
        ++accepted_;
      }
    });
  }
  ~SilentEndpoint() {
    stop_ = true;
    thread_.join();
    for (int fd : held_) ::close(fd);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_; }

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::mutex mutex_;
  std::vector<int> held_;
  std::thread thread_;
};

// Holds 127.0.0.1's port without listening on it (bound, no SO_REUSEADDR),
// as a closed connection's TIME_WAIT holds a port: nothing serves there, and
// a store cannot bind it until it is let go.
class HeldPort {
 public:
  HeldPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "cannot bind a port on loopback";
    port_ = ntohs(a.sin_port);
  }
  ~HeldPort() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

using StoreDeadline = LauncherTest;

std::vector<std::string> c10d_flags(const SilentEndpoint& silent, const std::string& join_timeout) {
  return {"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", silent.endpoint(), "--rdzv-id", "silent",
          "--rdzv-conf", "join_timeout=" + join_timeout};
}

std::vector<std::string> static_flags(const SilentEndpoint& silent, const std::string& join_timeout) {
  return {"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
          std::to_string(silent.port()), "--rdzv-conf", "join_timeout=" + join_timeout};
}

// Generous: join_timeout is 3 s; a ddprun still running after this is hung.
constexpr double kGenerous = 90;

void expect_gave_up(const Result& r, const std::string& endpoint) {
  ASSERT_NE(r.code, -1) << "ddprun did not end; stderr:\n" << r.err;
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("ddprun: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(endpoint), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did not answer"), std::string::npos) << r.err;
}

TEST_F(StoreDeadline, C10dJoinGivesUpOnASilentStore) {
  SilentEndpoint silent;
  Result r = start(c10d_flags(silent, "3"), {})->wait(kGenerous);
  expect_gave_up(r, silent.endpoint());
  EXPECT_GE(silent.accepted(), 1) << "ddprun never connected: the test did not test the silent store";
}

TEST_F(StoreDeadline, StaticJoinGivesUpOnASilentStore) {
  SilentEndpoint silent;
  Result r = start(static_flags(silent, "3"), {})->wait(kGenerous);
  expect_gave_up(r, silent.endpoint());
  EXPECT_GE(silent.accepted(), 1) << "ddprun never connected: the test did not test the silent store";
}

// The endpoint's port on this host is taken while nothing listens on it:
// the endpoint's node waits, says why, and serves the store once the port
// frees, where it used to wait for a store nobody served until join_timeout.
TEST_F(StoreDeadline, AnEndpointPortHeldWithoutAListenerIsServedOnceItFrees) {
  HeldPort held;
  auto p = start({"--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  held.endpoint(), "--rdzv-conf", "join_timeout=30"},
                 {});
  // Freed once ddprun says it waits (a loaded machine starts it slowly).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(25);
  while (p->current_err().find("and nothing listens on it; waiting until it frees") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  held.release();
  Result r = p->wait(kGenerous);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("and nothing listens on it; waiting until it frees"), std::string::npos) << r.err;
}

// Held past join_timeout: it ends saying what to do.
TEST_F(StoreDeadline, AnEndpointPortHeldPastJoinTimeoutEndsSayingWhatToDo) {
  HeldPort held;
  Result r = start({"--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    held.endpoint(), "--rdzv-conf", "join_timeout=2"},
                   {})
                 ->wait(kGenerous);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("with nothing listening on it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("outside the ephemeral range"), std::string::npos) << r.err;
}

// The store host's own ddprun, SIGSTOPped after it started serving: the
// other node connects (the kernel accepts for the stopped process) and
// hears nothing.
TEST_F(StoreDeadline, StaticJoinGivesUpOnAStoppedStoreHost) {
  uint16_t port = free_port();
  std::string go = dir_ + "/go";
  auto host = start({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(port), "--rdzv-conf",
                     "join_timeout=120"},
                    {"--until-file", go});
  ASSERT_TRUE(wait_for([&] { return port_listening(port); }, 60)) << host->current_err();
  ::kill(host->pid(), SIGSTOP);
  Result r = start({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                    std::to_string(port), "--rdzv-conf", "join_timeout=3"},
                   {"--until-file", go})
                 ->wait(kGenerous);
  // Ended as a user would end it, and reaped with whatever it started (its
  // watchdog) before the fixture counts leftovers: a SIGKILLed host's
  // watchdog was once still running then.
  host->signal(SIGTERM);
  host->signal(SIGCONT);
  EXPECT_NE(host->wait(kGenerous).code, -1);
  EXPECT_TRUE(wait_for([] {
    reap_zombies();
    return children_of(::getpid()).empty();
  }, 30));
  expect_gave_up(r, "127.0.0.1:" + std::to_string(port));
}

// Ctrl-C (or the batch system's SIGTERM) while ddprun waits on the silent
// store: it ends with 128+N, long before join_timeout.
void expect_signal_ends_wait(std::unique_ptr<Process> p, const SilentEndpoint& silent, int signo) {
  ASSERT_TRUE(wait_for([&] { return silent.accepted() >= 1; }, 60)) << p->current_err();
  // Let it get into the call that waits for the silent store's answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  p->signal(signo);
  Result r = p->wait(kGenerous);
  ASSERT_NE(r.code, -1) << "ddprun ignored " << signo << "; stderr:\n" << r.err;
  EXPECT_EQ(r.code, 128 + signo) << r.err;
  EXPECT_NE(r.err.find("stopped by"), std::string::npos) << r.err;
}

TEST_F(StoreDeadline, SigintEndsAC10dJoinOnASilentStore) {
  SilentEndpoint silent;
  expect_signal_ends_wait(start(c10d_flags(silent, "600"), {}), silent, SIGINT);
}

TEST_F(StoreDeadline, SigtermEndsAStaticJoinOnASilentStore) {
  SilentEndpoint silent;
  expect_signal_ends_wait(start(static_flags(silent, "600"), {}), silent, SIGTERM);
}

TEST_F(StoreDeadline, SigintEndsAStaticJoinOnASilentStore) {
  SilentEndpoint silent;
  expect_signal_ends_wait(start(static_flags(silent, "600"), {}), silent, SIGINT);
}

}  // namespace
}  // namespace ddprun_test
