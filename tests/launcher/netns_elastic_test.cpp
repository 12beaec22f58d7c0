// Elastic membership across namespace hosts on one switch (netns_util.h's
// NetnsHosts): one ddprun per host with --nnodes MIN:MAX over the c10d
// rendezvous, the LeNet example on the fixture's Fashion-MNIST files, the
// run folder shared as on a cluster. Nodes join late (admitted without a
// counted restart) and are killed (the others go on at the smaller size);
// each job must end with exit 0 on every node still there, and the samples
// each epoch trained on (the run's --log-samples record, cut where each
// later round resumed) must be the epoch's whole dataset exactly once, plus
// the padding a shard of uneven size adds. Root only; skips otherwise.
#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "netns_util.h"

#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace ddprun_test {
namespace {

constexpr int kTrainSamples = 1536;
constexpr int kEpochs = 4;

class NetnsElastic : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    ip_ = ip_bin();
    if (std::string why = netns_unavailable(ip_); !why.empty()) GTEST_SKIP() << why;
#ifndef LENET_FMNIST
    GTEST_SKIP() << "the examples are not built here (DDP_BUILD_EXAMPLES=OFF)";
#endif
    sweep_stale_namespaces(ip_, dir_);
    hosts_ = std::make_unique<NetnsHosts>(ip_, dir_, 3);
    if (std::string err = hosts_->create(); !err.empty()) {
      hosts_.reset();
      GTEST_SKIP() << "network namespaces unavailable here: " << err;
    }
    ddp::testing::write_fashion_mnist(dir_ + "/data", kTrainSamples, 256);
    port_ = std::to_string(20000 + std::random_device{}() % 20000);
  }
  void TearDown() override {
    kill_all_children();
    nodes_.clear();
    hosts_.reset();
    LauncherTest::TearDown();
  }

  // ddprun on host i; the store lives on host 0 (--rdzv-endpoint names it).
  Process& start_node(int i, const std::string& nnodes, const std::vector<std::string>& lenet_extra = {}) {
#ifdef LENET_FMNIST
    std::vector<std::string> argv{ip_, "netns", "exec", hosts_->ns[i], DDPRUN_BIN, "--nnodes", nnodes,
                                  "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                  hosts_->addr[0] + ":" + port_, "--rdzv-id", "elastic", "--rdzv-conf",
                                  "join_timeout=120,last_call_timeout=2,keep_alive_interval=1", "--max-restarts", "3",
                                  "--term-timeout", "30", LENET_FMNIST, "--epochs", std::to_string(kEpochs),
                                  "--global-batch-size", "96", "--data-dir", dir_ + "/data", "--run-dir", run_dir(),
                                  "--timeout", "20", "--preemption-check-every", "1", "--log-samples"};
    argv.insert(argv.end(), lenet_extra.begin(), lenet_extra.end());
    nodes_[i] = std::make_unique<Process>(argv, Env{{"GLOO_SOCKET_IFNAME", hosts_->veth[i]}, {"OMP_NUM_THREADS", "1"}},
                                          dir_);
#endif
    return *nodes_[i];
  }
  std::string run_dir() const { return dir_ + "/run"; }
  std::string all_err() const {
    std::string s;
    for (const auto& [i, p] : nodes_) s += "--- node " + std::to_string(i) + ":\n" + p->current_err();
    return s;
  }
  // Waits until the run is inside epoch `epoch` (1-based) on the logged progress.
  bool wait_for_epoch(int epoch) {
    return wait_for([&] { return read_file(run_dir() + "/log.txt").find("epoch " + std::to_string(epoch - 1) + ":") !=
                                 std::string::npos; },
                    200);
  }

  // Waits until some rank has recorded global step `step` (inside an epoch:
  // a stop then undoes the steps after the last checkpoint).
  bool wait_for_step(int64_t step) {
    return wait_for([&] {
      bool reached = false;
      for_each_sample_line([&](const std::string& line) {
        std::istringstream l(line);
        int64_t round = 0, epoch = 0, s = 0;
        reached = reached || (line[0] != '#' && l >> round >> epoch >> s && s >= step);
      });
      return reached;
    }, 200);
  }

  // Every line of every rank's --log-samples record.
  template <typename F>
  void for_each_sample_line(F&& f) const {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run_dir() + "/samples", ec)) {
      std::istringstream in(read_file(e.path().string()));
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) f(line);
    }
  }

  // Every epoch's surviving sample records hold each index once, plus padding.
  void expect_each_sample_once_per_epoch() {
    struct Record {
      int round;
      int64_t epoch, step;
      std::vector<int64_t> indices;
    };
    std::vector<Record> records;
    std::map<int, int64_t> resumed;  // round -> the step it resumed after
    for_each_sample_line([&](const std::string& line) {
      std::istringstream l(line);
      if (line.rfind("# resumed", 0) == 0) {
        std::string hash, word;
        int round = 0;
        int64_t step = 0;
        l >> hash >> word >> round >> step;
        resumed[round] = step;
        return;
      }
      Record r;
      l >> r.round >> r.epoch >> r.step;
      for (int64_t i; l >> i;) r.indices.push_back(i);
      records.push_back(r);
    });
    ASSERT_FALSE(records.empty()) << "no sample records in " << run_dir() << "/samples";
    std::map<int64_t, std::map<int64_t, int>> seen;  // epoch -> index -> times
    int undone = 0;
    for (const auto& r : records) {
      bool survived = true;  // no later round went back before this step
      for (const auto& [round, step] : resumed)
        if (round > r.round && step < r.step) survived = false;
      if (!survived) {
        ++undone;
        continue;
      }
      for (int64_t i : r.indices) ++seen[r.epoch][i];
    }
    std::string rounds;
    for (const auto& [round, step] : resumed) rounds += " " + std::to_string(round) + "@" + std::to_string(step);
    std::cout << records.size() << " step records, " << undone << " undone by a later resume; rounds (round@step):"
              << rounds << std::endl;
    ASSERT_EQ(static_cast<int>(seen.size()), kEpochs);
    for (const auto& [epoch, counts] : seen) {
      EXPECT_EQ(static_cast<int>(counts.size()), kTrainSamples) << "epoch " << epoch << " missed samples";
      int extra = 0;
      for (const auto& [i, n] : counts) extra += n - 1;
      std::cout << "epoch " << epoch << ": " << counts.size() << " distinct samples, " << extra << " repeated"
                << std::endl;
      // Padding: at most world - 1 (3 here) repeats per round that trained in the epoch.
      EXPECT_LE(extra, 2 * 3) << "epoch " << epoch << " repeated " << extra << " samples";
    }
  }

  std::string ip_, port_;
  std::unique_ptr<NetnsHosts> hosts_;
  std::map<int, std::unique_ptr<Process>> nodes_;
};

TEST_F(NetnsElastic, ALateNodeIsAdmittedMidEpochAndTrainingGoesOnAtThreeNodes) {
  start_node(0, "2:3");
  start_node(1, "2:3");
  ASSERT_TRUE(wait_for_epoch(2)) << all_err();
  start_node(2, "2:3");
  for (int i = 0; i < 3; ++i) {
    Result r = nodes_[i]->wait(240);
    EXPECT_EQ(r.code, 0) << "node " << i << ":\n" << r.out << r.err;
  }
  const std::string err = all_err();
  EXPECT_NE(err.find("world size 2 -> 3"), std::string::npos) << err;
  EXPECT_EQ(err.find("restart 1 of"), std::string::npos) << "a membership change counted as a restart:\n" << err;
  expect_each_sample_once_per_epoch();
}

TEST_F(NetnsElastic, AKilledNodeLeavesTheOthersToFinishAtTwoNodes) {
  for (int i = 0; i < 3; ++i) start_node(i, "2:3");
  // 16 steps an epoch (1536 samples, 96 a step): step 22 is inside epoch 2,
  // after its checkpoint, so the resume undoes the steps since.
  ASSERT_TRUE(wait_for_step(22)) << all_err();
  nodes_[2]->signal(SIGKILL);
  for (int i = 0; i < 2; ++i) {
    Result r = nodes_[i]->wait(240);
    EXPECT_EQ(r.code, 0) << "node " << i << ":\n" << r.out << r.err;
  }
  EXPECT_NE(all_err().find("world size 3 -> 2"), std::string::npos) << all_err();
  expect_each_sample_once_per_epoch();
}

TEST_F(NetnsElastic, TwoToOneToTwo) {
  start_node(0, "1:2");
  start_node(1, "1:2");
  ASSERT_TRUE(wait_for_step(22)) << all_err();
  nodes_[1]->signal(SIGKILL);
  ASSERT_TRUE(wait_for([&] { return nodes_[0]->current_err().find("world size 2 -> 1") != std::string::npos; }, 120))
      << all_err();
  // The lone node trains on; the newcomer joins it inside an epoch.
  ASSERT_TRUE(wait_for_step(40)) << all_err();
  start_node(2, "1:2");
  for (int i : {0, 2}) {
    Result r = nodes_[i]->wait(240);
    EXPECT_EQ(r.code, 0) << "node " << i << ":\n" << r.out << r.err;
  }
  EXPECT_NE(all_err().find("world size 1 -> 2"), std::string::npos) << all_err();
  expect_each_sample_once_per_epoch();
}

// ZeRO across 2 -> 3: the sharded Adam state that the three ranks resume with
// is, on every rank, bitwise a fresh 3-rank load of the consolidated
// checkpoint (tests/train/elastic_worker.cpp zero_train checks it and exits 1
// otherwise), and training goes on to the end.
TEST_F(NetnsElastic, ZeroShardsAreTakenAfreshAtThreeNodes) {
  std::vector<std::string> zero{"--epochs", "30", "--global-batch-size", "48", "--run-dir", run_dir(),
                                "--timeout", "20", "--preemption-check-every", "1"};
  auto start_zero = [&](int i) {
    std::vector<std::string> argv{ip_, "netns", "exec", hosts_->ns[i], DDPRUN_BIN, "--nnodes", "2:3",
                                  "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                  hosts_->addr[0] + ":" + port_, "--rdzv-id", "zero", "--rdzv-conf",
                                  "join_timeout=120,last_call_timeout=2", "--term-timeout", "30",
                                  DDP_ELASTIC_WORKER, "zero_train"};
    argv.insert(argv.end(), zero.begin(), zero.end());
    nodes_[i] = std::make_unique<Process>(
        argv, Env{{"GLOO_SOCKET_IFNAME", hosts_->veth[i]}, {"OMP_NUM_THREADS", "1"}, {"STEP_SLEEP_MS", "40"}}, dir_);
  };
  start_zero(0);
  start_zero(1);
  ASSERT_TRUE(wait_for_epoch(2)) << all_err();
  start_zero(2);
  std::string out;
  for (int i = 0; i < 3; ++i) {
    Result r = nodes_[i]->wait(240);
    EXPECT_EQ(r.code, 0) << "node " << i << ":\n" << r.out << r.err;
    out += r.out;
  }
  EXPECT_NE(all_err().find("world size 2 -> 3"), std::string::npos) << all_err();
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(out.find("zero: rank " + std::to_string(rank) + " of 3 resumed from 2 ranks holds a fresh load's share"),
              std::string::npos)
        << out;
}

TEST_F(NetnsElastic, OneNodeOfAtLeastTwoFailsWithinTheJoinTimeoutNamingTheMissingCount) {
#ifdef LENET_FMNIST
  std::vector<std::string> argv{ip_, "netns", "exec", hosts_->ns[0], DDPRUN_BIN, "--nnodes", "2:3",
                                "--rdzv-backend", "c10d", "--rdzv-endpoint", hosts_->addr[0] + ":" + port_,
                                "--rdzv-id", "alone", "--rdzv-conf", "join_timeout=5", LENET_FMNIST};
  Result r = Process(argv, {}, dir_).wait(60);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("only 1 of at least 2 nodes joined"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(1 missing)"), std::string::npos) << r.err;
#endif
}

}  // namespace
}  // namespace ddprun_test
