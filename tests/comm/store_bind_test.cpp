// Rank 0 serves the workers' rendezvous store at MASTER_ADDR:MASTER_PORT:
// on that address only (not every interface), and a MASTER_ADDR it cannot
// serve is reported as what it is: a name that does not resolve, an address
// of another host, or a port in use. In process, on loopback; the views from
// another host are in tests/launcher/store_bind_netns_test.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../support/reserved_port.h"
#include "ddp/errors.h"
#include "ddp/comm/process_group.h"

namespace {

// The local addresses (hex, as /proc/net/tcp{,6} write them) with a listening
// socket on `port`.
std::set<std::string> listening_addresses(uint16_t port) {
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state;
      in >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) out.insert(local.substr(0, colon));
    }
  }
  return out;
}

ddp::LaunchEnv rank0(const std::string& addr, uint16_t port, int world) {
  ddp::LaunchEnv env;
  env.rank = 0;
  env.world_size = world;
  env.master_addr = addr;
  env.master_port = port;
  return env;
}

// The error init_process_group throws for rank 0 (world of 2, so that no
// second rank ever comes), or "" when it succeeds.
std::string rank0_error(const std::string& addr, uint16_t port) {
  try {
    ddp::init_process_group(rank0(addr, port, 2),
                            ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(10)));
  } catch (const ddp::CommError& e) {
    return e.what();
  }
  ddp::destroy_process_group();
  return "";
}

TEST(StoreBind, RankZeroServesTheStoreOnMasterAddrOnly) {
  const uint16_t port = ddp::testing::reserved_port();
  auto group = ddp::init_process_group(rank0("127.0.0.1", port, 1),
                                       ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
  const auto listening = listening_addresses(port);
  ddp::destroy_process_group();
  // 127.0.0.1 alone: not 0.0.0.0, not IPv6's "::" (which takes IPv4 too).
  EXPECT_EQ(listening, std::set<std::string>{"0100007F"});
}

TEST(StoreBind, AMasterAddrOfAnotherHostIsReportedAsAnAddressProblem) {
  // 10.255.255.1: not this machine's (a test-net address nothing answers).
  const std::string what = rank0_error("10.255.255.1", ddp::testing::reserved_port());
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_ADDR"), std::string::npos) << what;
  EXPECT_NE(what.find("not an address of this host"), std::string::npos) << what;
  EXPECT_EQ(what.find("already in use"), std::string::npos) << what;
}

TEST(StoreBind, AMasterAddrThatDoesNotResolveIsReportedAsSuch) {
  const std::string what = rank0_error("ddp-no-such-host.invalid", ddp::testing::reserved_port());
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  EXPECT_NE(what.find("does not resolve"), std::string::npos) << what;
  EXPECT_EQ(what.find("already in use"), std::string::npos) << what;
}

TEST(StoreBind, APortInUseIsReportedAsSuch) {
  // A listener of this test's own on a port the kernel picks: in use, by us alone.
  int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t port = ntohs(a.sin_port);
  const std::string what = rank0_error("127.0.0.1", port);
  ::close(holder);
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  EXPECT_NE(what.find("already in use"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_PORT"), std::string::npos) << what;
}

}  // namespace
