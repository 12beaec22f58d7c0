// Two nodes in two network namespaces joined by a veth pair: one ddprun in
// each, training the library's DDP check model (ddp_train_check) across the
// link. Needs root and working `ip netns`; skips with the reason otherwise.
// The namespaces come from netns_util.h.
#include "../support/located.h"
#include "netns_util.h"

namespace ddprun_test {
namespace {

class NetnsTest : public NetnsHostsTest {
 protected:
  void SetUp() override {
    NetnsHostsTest::SetUp();
    if (IsSkipped()) return;
#ifndef DDP_TRAIN_CHECK
    GTEST_SKIP() << "the ddp_train_check target (tests/support/train_check.cpp) does not exist in this build";
#endif
  }

  void train_across(const std::vector<std::string>& rendezvous_flags_a,
                    const std::vector<std::string>& rendezvous_flags_b) {
#ifdef DDP_TRAIN_CHECK
    std::vector<std::unique_ptr<Process>> nodes;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv{ip_, "netns", "exec", pair_->ns[i], DDPRUN_BIN, "--nproc-per-node", "1",
                                    "--term-timeout", "5"};
      const auto& flags = i == 0 ? rendezvous_flags_a : rendezvous_flags_b;
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.push_back(DDP_TRAIN_CHECK);
      // Gloo must use the veth link, the only way between the namespaces.
      nodes.push_back(std::make_unique<Process>(
          argv, Env{{"GLOO_SOCKET_IFNAME", pair_->veth[i]}, {"OMP_NUM_THREADS", "1"}}, dir_));
    }
    Result a = nodes[0]->wait(240), b = nodes[1]->wait(240);
    EXPECT_EQ(a.code, 0) << a.out << a.err;
    EXPECT_EQ(b.code, 0) << b.out << b.err;
    // c10d ranks nodes in join order, so either node may be rank 0.
    std::string both = a.out + b.out;
    EXPECT_NE(both.find("[rank0]: rank 0/2"), std::string::npos) << both << a.err << b.err;
    EXPECT_NE(both.find("[rank1]: rank 1/2"), std::string::npos) << both << a.err << b.err;
#endif
  }

};

TEST_F(NetnsTest, TrainsAcrossTwoNamespacesWithStaticRendezvous) {
  std::string port = std::to_string(20000 + std::random_device{}() % 20000);
  std::vector<std::string> common{"--nnodes", "2", "--master-addr", pair_->addr[0], "--master-port", port,
                                  "--rdzv-conf", "join_timeout=120"};
  auto a = common, b = common;
  a.insert(a.end(), {"--node-rank", "0"});
  b.insert(b.end(), {"--node-rank", "1"});
  train_across(a, b);
}

TEST_F(NetnsTest, TrainsAcrossTwoNamespacesWithC10dRendezvous) {
  std::string endpoint = pair_->addr[0] + ":" + std::to_string(20000 + std::random_device{}() % 20000);
  std::vector<std::string> flags{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                                 "--rdzv-id", "netns", "--rdzv-conf", "join_timeout=120"};
  train_across(flags, flags);
}

}  // namespace
}  // namespace ddprun_test
