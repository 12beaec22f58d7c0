// The stores listen where they should, seen from real hosts: two network
// namespaces joined by a veth pair (netns_util.h), ddprun in the first.
//   --standalone: the workers' store on loopback only; neither the other
//     host nor this host's own non-loopback address reaches it.
//   static, one node: the workers' store on MASTER_ADDR only.
//   c10d: ddprun's rendezvous store on the endpoint's address only.
// The stores have no authentication (as PyTorch's): anyone who reaches the
// port can read and write them, which is why where they listen matters.
// Needs root and working `ip netns`; skips with the reason otherwise.
#include <random>

#include "../support/located.h"
#include "netns_util.h"

namespace ddprun_test {
namespace {

class StoreBindTest : public NetnsHostsTest {
 protected:
  // ddprun in the first namespace.
  std::unique_ptr<Process> ddprun_in_a(const std::vector<std::string>& args) {
    std::vector<std::string> argv{ip_, "netns", "exec", pair_->ns[0], DDPRUN_BIN, "--term-timeout", "5"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Process>(argv, Env{{"OMP_NUM_THREADS", "1"}}, dir_);
  }

  static std::string random_port() { return std::to_string(20000 + std::random_device{}() % 20000); }
};

TEST_F(StoreBindTest, StandaloneServesTheWorkersStoreOnLoopbackOnly) {
  std::string d = sub("store");
  auto p = ddprun_in_a({"--standalone", "--nproc-per-node", "2", STORE_WORKER_BIN, d});
  ASSERT_TRUE(wait_for([&] { return fs::exists(d + "/ready.0") && fs::exists(d + "/ready.1"); }, 90))
      << p->current_err();
  const auto port = static_cast<uint16_t>(std::stoi(read_file(d + "/ready.0")));
  const std::string a = pair_->ns[0], b = pair_->ns[1], addr_a = pair_->addr[0];
  EXPECT_EQ(connect_from(a, "127.0.0.1", port), 0) << "loopback must reach the store";
  EXPECT_EQ(connect_from(b, addr_a, port), ECONNREFUSED) << "another host reached the --standalone store";
  EXPECT_EQ(connect_from(a, addr_a, port), ECONNREFUSED) << "the host's own external address reached it";
  { std::ofstream(d + "/go") << "go"; }
  Result r = p->wait(90);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(StoreBindTest, StaticServesTheWorkersStoreOnMasterAddrOnly) {
  std::string d = sub("store");
  const std::string port_text = random_port();
  auto p = ddprun_in_a({"--nproc-per-node", "2", "--master-addr", pair_->addr[0], "--master-port", port_text,
                        STORE_WORKER_BIN, d});
  ASSERT_TRUE(wait_for([&] { return fs::exists(d + "/ready.0") && fs::exists(d + "/ready.1"); }, 90))
      << p->current_err();
  const auto port = static_cast<uint16_t>(std::stoi(port_text));
  EXPECT_EQ(connect_from(pair_->ns[1], pair_->addr[0], port), 0) << "the other host must reach MASTER_ADDR";
  EXPECT_EQ(connect_from(pair_->ns[0], "127.0.0.1", port), ECONNREFUSED)
      << "the store listens beyond MASTER_ADDR (loopback reached it)";
  { std::ofstream(d + "/go") << "go"; }
  Result r = p->wait(90);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(StoreBindTest, C10dRendezvousStoreListensOnTheEndpointAddressOnly) {
  std::string pids = sub("pids");
  std::string go = dir_ + "/go";
  const std::string port_text = random_port();
  auto p = ddprun_in_a({"--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        pair_->addr[0] + ":" + port_text, "--rdzv-id", "bind", TEST_WORKER_BIN, "--pid-dir", pids,
                        "--until-file", go});
  ASSERT_TRUE(wait_for([&] { return fs::exists(pids + "/pid.0.0"); }, 90)) << p->current_err();
  const auto port = static_cast<uint16_t>(std::stoi(port_text));
  EXPECT_EQ(connect_from(pair_->ns[1], pair_->addr[0], port), 0) << "the other host must reach the endpoint";
  EXPECT_EQ(connect_from(pair_->ns[0], "127.0.0.1", port), ECONNREFUSED)
      << "the rendezvous store listens beyond its endpoint (loopback reached it)";
  { std::ofstream(go) << "go"; }
  Result r = p->wait(90);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace ddprun_test
