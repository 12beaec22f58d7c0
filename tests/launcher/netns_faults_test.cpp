// The network fails under a two-host job: two network namespaces joined by a
// veth pair, one ddprun in each, the LeNet example training across the link.
// Once the first checkpoint is on disk the link goes down. Without restarts
// every rank fails within the process group's timeout with an error that says
// so, and both ddpruns exit non-zero. With --max-restarts the link comes back
// after the failure and the restarted job resumes from the checkpoint and
// finishes. Root only (skips with the reason otherwise).
#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "netns_util.h"

namespace ddprun_test {
namespace {

constexpr int kGroupTimeout = 8;  // seconds: lenet --timeout

class NetnsFaults : public NetnsHostsTest {
 protected:
  void SetUp() override {
    NetnsHostsTest::SetUp();
    if (IsSkipped()) return;
#ifndef LENET_FMNIST
    GTEST_SKIP() << "the examples are not built here (DDP_BUILD_EXAMPLES=OFF)";
#endif
    ddp::testing::write_fashion_mnist(dir_ + "/data", 2048, 64);
  }
  void TearDown() override {
    nodes_.clear();  // before the namespaces
    NetnsHostsTest::TearDown();
  }

  // One ddprun per namespace; the run folder is shared, as on a cluster's
  // shared file system.
  void start_job(int max_restarts) {
#ifdef LENET_FMNIST
    const std::string port = std::to_string(20000 + std::random_device{}() % 20000);
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv{ip_, "netns", "exec", pair_->ns[i], DDPRUN_BIN, "--nnodes", "2", "--node-rank",
                                    std::to_string(i), "--nproc-per-node", "1", "--master-addr", pair_->addr[0],
                                    "--master-port", port, "--max-restarts", std::to_string(max_restarts),
                                    "--rdzv-conf", "join_timeout=120", "--term-timeout", "5", LENET_FMNIST,
                                    "--epochs", "8", "--global-batch-size", "64", "--data-dir", dir_ + "/data",
                                    "--run-dir", run_dir(), "--timeout", std::to_string(kGroupTimeout), "--resume",
                                    "auto"};
      nodes_.push_back(std::make_unique<Process>(
          argv, Env{{"GLOO_SOCKET_IFNAME", pair_->veth[i]}, {"OMP_NUM_THREADS", "1"}}, dir_));
    }
#endif
  }
  std::string run_dir() const { return dir_ + "/run"; }
  bool link(bool up) {
    return run_cmd({ip_, "-n", pair_->ns[0], "link", "set", pair_->veth[0], up ? "up" : "down"}, dir_).code == 0;
  }
  // Waits for the first checkpoint, then takes the link down; the time it went down.
  std::chrono::steady_clock::time_point cut_after_first_checkpoint() {
    EXPECT_TRUE(wait_for([&] { return fs::exists(run_dir() + "/checkpoint/manifest.pt"); }, 180)) << "no checkpoint";
    EXPECT_TRUE(link(false));
    return std::chrono::steady_clock::now();
  }

  std::vector<std::unique_ptr<Process>> nodes_;
};

TEST_F(NetnsFaults, LinkDownFailsEveryRankWithinTheTimeoutAndDdprunExitsNonZero) {
  start_job(0);
  const auto cut = cut_after_first_checkpoint();
  Result a = nodes_[0]->wait(240), b = nodes_[1]->wait(240);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::cout << "both ddpruns ended " << seconds << " s after the link went down (group timeout " << kGroupTimeout
            << " s)" << std::endl;
  EXPECT_NE(a.code, 0) << a.out << a.err;
  EXPECT_NE(b.code, 0) << b.out << b.err;
  // Each node says why: its worker timed out on a collective, or ddprun lost
  // the rendezvous store behind the link; the failure summary follows.
  for (const Result* r : {&a, &b}) {
    const std::string all = r->out + r->err;
    EXPECT_TRUE(all.find("Timed out waiting") != std::string::npos ||
                all.find("lost contact with the rendezvous store") != std::string::npos)
        << all;
    EXPECT_NE(r->err.find("Root Cause"), std::string::npos) << r->err;
  }
  // The group timeout, ddprun's teardown, and slack for a loaded 2-core machine.
  EXPECT_LT(seconds, 3.0 * kGroupTimeout + 60) << "failing took far longer than the group's timeout";
}

TEST_F(NetnsFaults, WithRestartsTheJobResumesOnceTheLinkIsBack) {
  start_job(1);
  cut_after_first_checkpoint();
  // The failure is seen (a ddpruns says it restarts), then the link returns.
  const bool restarting = wait_for(
      [&] {
        return nodes_[0]->current_err().find("restarting") != std::string::npos ||
               nodes_[1]->current_err().find("restarting") != std::string::npos;
      },
      180);
  EXPECT_TRUE(restarting) << nodes_[0]->current_err() << nodes_[1]->current_err();
  EXPECT_TRUE(link(true));
  Result a = nodes_[0]->wait(300), b = nodes_[1]->wait(300);
  EXPECT_EQ(a.code, 0) << a.out << a.err;
  EXPECT_EQ(b.code, 0) << b.out << b.err;
  const std::string both = a.out + a.err + b.out + b.err;
  EXPECT_NE(both.find("resumed from " + run_dir() + "/checkpoint after epoch"), std::string::npos) << both;
  EXPECT_TRUE(fs::exists(run_dir() + "/model.pt"));
}

}  // namespace
}  // namespace ddprun_test
