// ddp::dist against torch.distributed (PyTorch 1.13's, or the wheel's in the
// 2.x build): every case of pytorch_dist_parity.py at 2, 3 and 4 ranks over
// Gloo, line for line and bit for bit (the inputs make every reduction exact
// in any order); over our MPI backend at 2 and 4 ranks, where the ops Gloo
// lacks are held to the result PyTorch computes from every rank's inputs.
// And the refusals that must come before anything starts, on every rank.
#include <gtest/gtest.h>

#include <ddp/comm/dist.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "../support/located.h"
#include "../support/multiprocess.h"
#include "../support/parity_compare.h"

namespace {

using namespace ddp::testing;
namespace dist = ddp::dist;

// The C++ call that looks like Python's must do what it does, or not compile:
// async_op in PyTorch's place (after op and group), and nowhere else.
template <typename... A>
auto can_all_reduce(int, A&&... a) -> decltype(dist::all_reduce(std::forward<A>(a)...), std::true_type{});
template <typename... A>
std::false_type can_all_reduce(long, A&&...);
static_assert(decltype(can_all_reduce(0, std::declval<at::Tensor>(), ddp::ReduceOp::MAX))::value);
static_assert(decltype(can_all_reduce(0, std::declval<at::Tensor>(), ddp::ReduceOp::SUM, dist::group::WORLD, true))::value);
static_assert(!decltype(can_all_reduce(0, std::declval<at::Tensor>(), true))::value);
static_assert(!decltype(can_all_reduce(0, std::declval<at::Tensor>(), ddp::ReduceOp::SUM, true))::value);
static_assert(std::is_same_v<decltype(dist::all_reduce(std::declval<at::Tensor>())), ddp::Work>);

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

std::string make_dir() {
  char t[] = "/tmp/ddp_dist_XXXXXX";
  return ::mkdtemp(t);
}

// PyTorch's lines as our backend must write them: over Gloo, as they are
// (without the "expect" lines); over MPI, each "unsupported" replaced by the
// result PyTorch computed for it, and the backend's name.
std::vector<std::string> wanted(const std::vector<std::string>& torch_lines, const std::string& backend) {
  std::vector<std::string> out;
  for (size_t i = 0; i < torch_lines.size(); ++i) {
    const auto& l = torch_lines[i];
    if (l.rfind("expect ", 0) == 0) continue;
    if (backend == "mpi" && l.size() > 12 && l.compare(l.size() - 12, 12, " unsupported") == 0 &&
        i + 1 < torch_lines.size() && torch_lines[i + 1].rfind("expect ", 0) == 0) {
      out.push_back(torch_lines[i + 1].substr(7));
      continue;
    }
    if (backend == "mpi" && l.rfind("get ", 0) == 0) {
      out.push_back(l.substr(0, l.rfind(' ')) + " mpi");
      continue;
    }
    out.push_back(l);
  }
  return out;
}

void compare(const std::string& dir, int world, const std::string& backend) {
  for (int r = 0; r < world; ++r) {
    const auto theirs = wanted(lines_of(dir + "/torch_r" + std::to_string(r) + ".txt"), backend);
    const auto ours = lines_of(dir + "/cpp_r" + std::to_string(r) + ".txt");
    ASSERT_FALSE(theirs.empty()) << "rank " << r << ": PyTorch wrote nothing";
    EXPECT_EQ(ours.size(), theirs.size()) << "rank " << r;
    for (size_t i = 0; i < std::min(ours.size(), theirs.size()); ++i)
      EXPECT_EQ(ours[i], theirs[i]) << "rank " << r << ", line " << i + 1;
  }
}

std::vector<RankResult> run_oracle(int world, const std::string& dir) {
  return run_ranks(world, oracle_python(), {DIST_PARITY_SCRIPT, dir}, {{"DDP_TEST_DIR", dir}});
}

class DistParity : public ::testing::TestWithParam<int> {};

TEST_P(DistParity, EveryCollectiveBitwiseEqualToTorchDistributedOverGloo) {
  if (!have_pytorch("torch.distributed"))
    GTEST_SKIP() << oracle_python() << " with torch.distributed is not installed (apt-get install python3-torch)";
  const int world = GetParam();
  const std::string dir = make_dir();
  auto theirs = run_oracle(world, dir);
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  auto ours = run_ranks(world, DIST_WORKER, {"parity"}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : ours) ASSERT_EQ(r.exit_code, 0) << describe(ours);
  compare(dir, world, "gloo");
  std::filesystem::remove_all(dir);
}

class DistOverMpi : public ::testing::TestWithParam<int> {};

TEST_P(DistOverMpi, EveryCollectiveEqualToTorchDistributedAndTheOnesGlooLacksToTheirResult) {
  if (!have_pytorch("torch.distributed"))
    GTEST_SKIP() << oracle_python() << " with torch.distributed is not installed (apt-get install python3-torch)";
  if (ddp::mpi_library_version().empty()) GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI)";
  if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  const int world = GetParam();
  const std::string dir = make_dir();
  auto theirs = run_oracle(world, dir);
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  // The gloo group made beside the mpi one serves its store at MASTER_PORT.
  auto ours = run_mpirun(world, DIST_WORKER, {"parity"},
                         {{"DDP_TEST_DIR", dir},
                          {"DDP_TEST_BACKEND", "mpi"},
                          {"MASTER_PORT", std::to_string(free_port())}});
  ASSERT_EQ(ours.exit_code, 0) << describe(ours);
  compare(dir, world, "mpi");
  std::filesystem::remove_all(dir);
}

void expect_refusals(const std::vector<std::string>& outputs, const std::string& backend) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"avg", "AVG is NCCL's only"},
      {"band_float", "BAND"},
      {"src_outside", "src 2 is not a rank of the group"},
      {"new_group_twice", "listed twice"},
      {"new_group_outside", "not a rank of the job"},
      {"group_rank_outside", "is not in the group"},
      {"undefined", "undefined"},
      {"send_self", "Invalid destination rank"},
      {"premul_bare", "needs its factor"},
      {"premul_here", "PREMUL_SUM is NCCL's only"},
      {"batch_empty", "empty"},
      {"p2p_op", "Expected ``op``"},
      {"object_list_size", "object_list has 1 entries"},
      {"object_not_plain", "is not plain data"},
      {"new_group_backend", "unknown backend 'ucc'"},
      {"dict_keys", "keys of two kinds"}};
  for (int r = 0; r < 2; ++r) {
    const auto& out = outputs[r];
    for (const auto& [name, words] : cases) {
      const auto at = out.find("ERR " + name + ": rank " + std::to_string(r));
      ASSERT_NE(at, std::string::npos) << "rank " << r << " case " << name << ":\n" << out;
      EXPECT_NE(out.substr(at, out.find('\n', at) - at).find(words), std::string::npos) << out;
    }
    EXPECT_NE(out.find("ERR scatter_list_missing: rank " + std::to_string(r)), std::string::npos) << out;
    EXPECT_NE(out.find(r == 0 ? "ERR scatter_object_refused: rank 0: dist.scatter_object_list: scatter_object_input_list "
                                "has 1 entries on src"
                              : "ERR scatter_object_refused: rank 1: the scatter's source (rank 0 of the group) refused"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(backend == "mpi" ? "ERR get_future: rank " + std::to_string(r) + ": Work::get_future(): mpi"
                                        : std::string("future 4")),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("built {'rank': 1, 'names': ['a', 'b'], 'shape': (2, 3)}"), std::string::npos) << out;
    EXPECT_NE(out.find("must be specified on source rank"), std::string::npos) << out;
    // gather to 0: rank 0 gave no list, rank 1 gave one
    EXPECT_NE(out.find(r == 0 ? "must be specified on destination rank" : "must NOT be specified on non-destination"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("after 6"), std::string::npos) << out;
    if (backend == "mpi") {
      EXPECT_NE(out.find("ERR dtype_mismatch: rank " + std::to_string(r)), std::string::npos) << out;
      EXPECT_NE(out.find("ERR monitored_barrier: rank " + std::to_string(r)), std::string::npos) << out;
      EXPECT_NE(out.find("only implemented for GLOO"), std::string::npos) << out;
    }
    // Work and groups as torch.distributed's (dist_worker.cpp's work_api).
    EXPECT_NE(out.find("groups " + std::to_string(r) + " 2 2"), std::string::npos) << out;
  }
  const auto& receiver = outputs[0];
  EXPECT_NE(receiver.find("completed_after 1 source 1"), std::string::npos) << receiver;
  if (backend == "mpi") {  // the receive's wait gave up after 300 ms, naming its peer and tag, with no DDP advice
    EXPECT_NE(receiver.find("ERR wait_timeout: rank 0: mpi recv from rank 1 (tag 97) failed: not finished within the "
                            "wait's timeout of 300 ms"),
              std::string::npos)
        << receiver;
    EXPECT_NE(receiver.find("wait_timeout_advice p2p"), std::string::npos) << receiver;
    EXPECT_NE(receiver.find("completed_before 0"), std::string::npos) << receiver;
  }
  EXPECT_NE(outputs[1].find("ERR send_source_rank: Work::source_rank() is a receive's"), std::string::npos)
      << outputs[1];
}

TEST(DistErrors, RefusedOnEveryRankBeforeAnythingStartsAndTheGroupWorksAfter) {
  auto ranks = run_ranks(2, DIST_WORKER, {"errors"});
  for (const auto& r : ranks) ASSERT_EQ(r.exit_code, 0) << describe(ranks);
  expect_refusals({ranks[0].output, ranks[1].output}, "gloo");
}

TEST(DistErrors, RefusedOnEveryRankOverMpiToo) {
  if (ddp::mpi_library_version().empty()) GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI)";
  if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  auto ours = run_mpirun(2, DIST_WORKER, {"errors"}, {{"DDP_TEST_BACKEND", "mpi"}});
  ASSERT_EQ(ours.exit_code, 0) << describe(ours);
  expect_refusals(ours.ranks, "mpi");
}

// Gloo's monitored barrier: passed when every rank comes; when rank 0 comes
// alone, it names the ranks that did not, within the timeout given.
TEST(MonitoredBarrier, PassesWhenAllComeAndNamesTheRanksThatDidNot) {
  auto ranks = run_ranks(3, DIST_WORKER, {"monitored"});
  for (const auto& r : ranks) {
    ASSERT_EQ(r.exit_code, 0) << describe(ranks);
    EXPECT_NE(r.output.find("passed"), std::string::npos) << r.output;
  }
  const std::string& out = ranks[0].output;
  ASSERT_NE(out.find("ERR monitored: rank 0: "), std::string::npos) << out;
  EXPECT_NE(out.find("1, 2"), std::string::npos) << out;
  EXPECT_NE(out.find("1000 ms"), std::string::npos) << out;
}

// new_group's backend: a group of the other kind beside the default one,
// under mpirun both ways (an mpi group beside gloo; gloo beside mpi is in
// the parity case above), and a gloo group beside gloo.
TEST(GroupBeside, AnotherBackendsGroupBesideTheDefaultOne) {
  std::vector<std::pair<std::string, std::string>> pairs = {{"gloo", "gloo"}};
  const bool mpi = !ddp::mpi_library_version().empty() && !mpirun_path().empty();
  if (mpi) pairs.push_back({"gloo", "mpi"});
  for (const auto& [first, other] : pairs) {
    std::vector<std::string> outputs;
    if (other == "mpi") {
      auto ours = run_mpirun(3, DIST_WORKER, {"beside"},
                             {{"DDP_TEST_BACKEND", first}, {"DDP_TEST_OTHER_BACKEND", other},
                              {"MASTER_PORT", std::to_string(free_port())}});
      ASSERT_EQ(ours.exit_code, 0) << describe(ours);
      outputs = ours.ranks;
    } else {
      auto ranks =
          run_ranks(3, DIST_WORKER, {"beside"}, {{"DDP_TEST_BACKEND", first}, {"DDP_TEST_OTHER_BACKEND", other}});
      for (const auto& r : ranks) ASSERT_EQ(r.exit_code, 0) << describe(ranks);
      for (const auto& r : ranks) outputs.push_back(r.output);
    }
    ASSERT_EQ(outputs.size(), 3u);
    for (const auto& out : outputs) EXPECT_NE(out.find("beside " + other + " 12 " + other), std::string::npos) << out;
  }
  if (!mpi) GTEST_SKIP() << "the mpi half needs a libddp with MPI and mpirun (apt-get install openmpi-bin)";
}

// Output a program must not print when it ends: a warning of ours or
// PyTorch's, an abort, a note that the group was not destroyed.
void expect_clean_end(const std::string& out) {
  for (const char* bad : {"WARN", "Warning", "destroy_process_group", "deprecated", "terminate", "Abort"})
    EXPECT_EQ(out.find(bad), std::string::npos) << "'" << bad << "' in:\n" << out;
}

// destroy_process_group() while the program still holds the group, as
// torch.distributed's: no default group after it, and every later call on
// the held group is a UsageError that names destroy_process_group.
TEST(ProcessGroupTeardown, DestroyShutsTheBackendDownWhileTheProgramHoldsIt) {
  auto ranks = run_ranks(2, DIST_WORKER, {"teardown"});
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string& out = ranks[r].output;
    ASSERT_EQ(ranks[r].exit_code, 0) << describe(ranks);
    EXPECT_NE(out.find("before 6"), std::string::npos) << out;
    EXPECT_NE(out.find("initialized 0"), std::string::npos) << out;
    EXPECT_EQ(out.find("ran "), std::string::npos) << out;
    for (const char* call : {"allreduce", "barrier", "all_gather", "dist_broadcast"})
      EXPECT_NE(out.find(std::string("ERR ") + call + ": rank " + std::to_string(r) + ": "), std::string::npos)
          << call << ":\n" << out;
    EXPECT_NE(out.find("that destroy_process_group() has shut down"), std::string::npos) << out;
    EXPECT_NE(out.find("ERR dist_all_reduce_default: no default process group"), std::string::npos) << out;
    for (const char* bad : {"WARN", "Warning", "deprecated", "terminate", "Abort"})
      EXPECT_EQ(out.find(bad), std::string::npos) << "'" << bad << "' in:\n" << out;
  }
}

// A program that returns from main without destroy_process_group() exits 0
// and prints nothing of its own or PyTorch's at exit (each rank started by
// itself: its whole exit, every static object's destructor included).
TEST(ProcessGroupTeardown, ReturningFromMainWithoutDestroyEndsCleanly) {
  auto ranks = run_ranks(2, DIST_WORKER, {"exit"}, {{"DDP_TEST_EXEC_EACH_RANK", "1"}});
  for (const auto& r : ranks) {
    ASSERT_EQ(r.exit_code, 0) << describe(ranks);
    EXPECT_NE(r.output.find("summed 6"), std::string::npos) << r.output;
    expect_clean_end(r.output);
  }
}

TEST(ProcessGroupTeardown, ReturningFromMainWithoutDestroyEndsCleanlyOverMpi) {
  if (ddp::mpi_library_version().empty()) GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI)";
  if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  auto ours = run_mpirun(2, DIST_WORKER, {"exit"}, {{"DDP_TEST_BACKEND", "mpi"}});
  ASSERT_EQ(ours.exit_code, 0) << describe(ours);
  for (const auto& out : ours.ranks) {
    EXPECT_NE(out.find("summed 6"), std::string::npos) << out;
    expect_clean_end(out);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DistParity, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "world_" + std::to_string(i.param); });
INSTANTIATE_TEST_SUITE_P(Ranks, DistOverMpi, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "world_" + std::to_string(i.param); });

}  // namespace
