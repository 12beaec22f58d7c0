// The store client that ddprun's rendezvous and the workers share
// (src/comm/store): a Deadline ends a call that a silent store holds, and a
// connection leaves no thread of c10d's behind that a lost server could set
// spinning or end the process from, even one lost while it connects.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "comm/store/store_client.h"
#include "comm/store/store_deadline.h"

namespace {

// A loopback listener that never accepts by itself: the kernel completes
// connections into its backlog, so a client connects to a store that never
// answers (a hung or SIGSTOPped host).
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  uint16_t port() const { return port_; }

  // Takes the next connection from the backlog and resets it (RST), as a
  // host's kernel does to connections its dying server never accepted.
  void reset_next() {
    const int c = ::accept(fd_, nullptr, nullptr);
    linger hard{1, 0};
    ::setsockopt(c, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(c);
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

c10d::TCPStoreOptions client_options(uint16_t port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return o;
}

ddp::store_deadline::Ended call_on_silent_store(std::chrono::milliseconds after, const std::function<bool()>& stop) {
  SilentListener silent;
  auto o = client_options(silent.port(), std::chrono::seconds(600));
  using ddp::store_deadline::Clock;
  try {
    // 2.x's constructor pings: connect() itself must give up (after 1 s).
    auto c = ddp::store_client::connect("127.0.0.1", o, std::chrono::seconds(1), stop);
    ddp::store_deadline::Deadline bound(Clock::now() + after, c.sockets, stop);
    try {
      c.store->compareSet("k", {}, {1});
      ADD_FAILURE() << "a silent store answered";
    } catch (const std::exception&) {
    }
    return bound.ended();
  } catch (const std::exception& e) {
    EXPECT_GE(TORCH_VERSION_MAJOR, 2) << "1.13's constructor does not wait for an answer: " << e.what();
    return stop && stop() ? ddp::store_deadline::Ended::Stop : ddp::store_deadline::Ended::Deadline;
  }
}

TEST(StoreDeadline, EndsACallOnASilentStoreAtTheDeadline) {
  EXPECT_EQ(call_on_silent_store(std::chrono::milliseconds(500), {}), ddp::store_deadline::Ended::Deadline);
}

TEST(StoreDeadline, EndsACallOnASilentStoreWhenToldToStop) {
  auto start = std::chrono::steady_clock::now();
  auto stop = [start] { return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300); };
  EXPECT_EQ(call_on_silent_store(std::chrono::seconds(600), stop), ddp::store_deadline::Ended::Stop);
}

int threads_now() {
  int n = 0;
  for ([[maybe_unused]] const auto& t : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// LibTorch 1.13's client starts a thread on a second connection for
// watchKey() callbacks; once its server is gone, that thread spins on the
// closed socket. The client stops it: this process has no more threads
// after connecting than before.
TEST(StoreClient, LeavesNoThreadOfC10dsBehind) {
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const int before = threads_now();
  auto c = ddp::store_client::connect("127.0.0.1", client_options(server->getPort(), std::chrono::seconds(10)),
                                      std::chrono::seconds(10));
  c.store->set("k", {1});
  EXPECT_EQ(c.store->get("k"), std::vector<uint8_t>{1});
  int now = threads_now();
  for (int i = 0; i < 500 && now != before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = threads_now();
  }
  EXPECT_EQ(now, before) << "threads before the client connected: " << before;
}

// A server that dies while this client's connections still wait in its
// backlog resets them (RST). With 1.13's watchKey() thread still running,
// the reset ended the process (std::terminate from that thread): a surviving
// ddprun aborted instead of reporting its lost store. Checked in a child
// process, whose end the test reads.
TEST(StoreClient, AResetByALostServerLeavesTheProcessRunning) {
  if (TORCH_VERSION_MAJOR >= 2)
    GTEST_SKIP() << "LibTorch 2.x's client has no watchKey() thread, and its constructor waits for the "
                    "server's answer, which this listener never gives";
  SilentListener lost;
  int connected[2];
  int reset[2];
  ASSERT_EQ(::pipe(connected), 0);
  ASSERT_EQ(::pipe(reset), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte = 0;
    try {
      auto c = ddp::store_client::connect("127.0.0.1", client_options(lost.port(), std::chrono::seconds(5)),
                                          std::chrono::seconds(5));
      (void)!::write(connected[1], &byte, 1);
      (void)!::read(reset[0], &byte, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::_exit(0);
    } catch (const std::exception&) {
      ::_exit(3);
    }
  }
  char byte = 0;
  if (::read(connected[0], &byte, 1) == 1) {
    lost.reset_next();  // the client's connection
    lost.reset_next();  // and its watchKey() thread's
  }
  (void)!::write(reset[1], &byte, 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  for (int fd : {connected[0], connected[1], reset[0], reset[1]}) ::close(fd);
  ASSERT_TRUE(WIFEXITED(status)) << "the client's process ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: it could not connect";
}

// The same reset while the client is being constructed: the server's kernel
// resets each connection the moment it is made (a host whose server dies
// as it accepts, as a node's ddprun acknowledging the end of a round to a
// store host being killed saw). 1.13's watchKey() thread then reads the
// reset before the construction has returned; it must have been stopped
// before it ran (stopped_pipes.h), or the process ends from it.
TEST(StoreClient, AResetDuringTheConnectionLeavesTheProcessRunning) {
  if (TORCH_VERSION_MAJOR >= 2)
    GTEST_SKIP() << "LibTorch 2.x's client has no watchKey() thread, and its constructor waits for the "
                    "server's answer, which this listener never gives";
  for (int attempt = 0; attempt < 3; ++attempt) {
    SilentListener lost;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        auto c = ddp::store_client::connect("127.0.0.1", client_options(lost.port(), std::chrono::seconds(5)),
                                            std::chrono::seconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::_exit(0);
      } catch (const std::exception&) {
        ::_exit(3);
      }
    }
    lost.reset_next();  // the client's connection
    lost.reset_next();  // and its watchKey() thread's, as it starts
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "attempt " << attempt << ": the client's process ended by signal "
                                   << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "3: it could not connect";
  }
}

}  // namespace
