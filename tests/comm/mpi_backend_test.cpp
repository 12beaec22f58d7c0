// The mpi backend's refusals, in one process: a build without MPI, or a
// process mpirun did not start, gets a UsageError saying what to do; and
// LaunchEnv's Open MPI reading across hosts without MASTER_ADDR.
#include <gtest/gtest.h>

#include <map>

#include "ddp/runtime/launch_env.h"
#include "ddp/comm/process_group.h"

namespace {
bool with_mpi() { return !ddp::mpi_library_version().empty(); }

ddp::LaunchEnv parse(const std::map<std::string, std::string>& env) {
  return ddp::LaunchEnv::from_lookup([&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}
}  // namespace

TEST(MpiBackend, IsAKnownOption) {
  EXPECT_EQ(ddp::ProcessGroupOptions().backend("mpi").backend(), "mpi");
  try {
    ddp::ProcessGroupOptions().backend("mpich");
    FAIL() << "no error";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("mpi"), std::string::npos) << e.what();
  }
}

TEST(MpiBackend, RequestedOutsideMpirunOrWithoutMpiIsAClearError) {
  ddp::LaunchEnv single;  // no launcher at all: not started by mpirun
  try {
    ddp::init_process_group(single, ddp::ProcessGroupOptions().backend("mpi"));
    FAIL() << "no error";
  } catch (const ddp::UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank 0: ", 0), 0u) << what;
    if (with_mpi()) {
      EXPECT_NE(what.find("started by Open MPI's mpirun"), std::string::npos) << what;
      EXPECT_NE(what.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("not compiled into this libddp"), std::string::npos) << what;
      EXPECT_NE(what.find("libopenmpi-dev"), std::string::npos) << what;
    }
  }
  EXPECT_FALSE(ddp::is_initialized());
}

TEST(MpiBackend, LibraryVersionNamesOpenMpiWhenBuilt) {
  if (!with_mpi()) GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI)";
  EXPECT_NE(ddp::mpi_library_version().find("MPI"), std::string::npos) << ddp::mpi_library_version();
}

// mpirun across hosts, no MASTER_ADDR: with MPI built, rank 0's address is
// left to be learned over MPI; without, LaunchEnv refuses and says how to
// pass it.
TEST(LaunchEnvMpi, OpenMpiAcrossNodesWithoutMasterLearnsItOverMpiOrSaysHowToPassIt) {
  const std::map<std::string, std::string> vars = {{"OMPI_COMM_WORLD_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                   {"PMIX_NAMESPACE", "prterun-a-1@1"}};
  if (with_mpi()) {
    const auto e = parse(vars);
    EXPECT_TRUE(e.master_over_mpi);
    EXPECT_EQ(e.master_addr, "");
    EXPECT_EQ(e.master_port, ddp::default_port_for_job("mpi:prterun-a-1@1"));
  } else {
    try {
      parse(vars);
      FAIL() << "no error";
    } catch (const ddp::LaunchEnvError& e) {
      EXPECT_NE(std::string(e.what()).find("-x MASTER_ADDR"), std::string::npos) << e.what();
    }
  }
  // MASTER_ADDR given: taken as it is, in every build.
  auto with_master = vars;
  with_master["MASTER_ADDR"] = "10.0.0.1";
  const auto e = parse(with_master);
  EXPECT_FALSE(e.master_over_mpi);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  // One node: loopback, nothing to learn.
  auto one_node = vars;
  one_node["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  EXPECT_FALSE(parse(one_node).master_over_mpi);
  EXPECT_EQ(parse(one_node).master_addr, "127.0.0.1");
}
