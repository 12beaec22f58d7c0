#include "ddp/runtime/launch_env.h"
#include "ddp/comm/process_group.h"  // mpi_library_version

#include <gtest/gtest.h>

#include <map>

using ddp::LaunchEnv;
using Env = std::map<std::string, std::string>;

namespace {
LaunchEnv parse(const Env& env) {
  return LaunchEnv::from_lookup([&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}
// The error message of a malformed environment, which must name `variable`.
void expect_error(const Env& env, const std::string& variable) {
  try {
    parse(env);
    FAIL() << "no error; expected one naming " << variable;
  } catch (const ddp::LaunchEnvError& e) {
    EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
  }
}
const Env torchrun{{"RANK", "3"},        {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}};
}  // namespace

TEST(LaunchEnv, NothingSetIsOneProcess) {
  auto e = parse({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.source, LaunchEnv::Source::Single);
}

TEST(LaunchEnv, Torchrun) {
  auto e = parse(torchrun);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_EQ(e.source_name(), "torchrun");
}

TEST(LaunchEnv, TorchrunWinsOverSlurmAndMpi) {
  Env env = torchrun;
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "1";
  env["OMPI_COMM_WORLD_RANK"] = "0";
  EXPECT_EQ(parse(env).rank, 3);
}

TEST(LaunchEnv, Slurm) {
  auto e = parse({{"SLURM_PROCID", "5"},
                  {"SLURM_STEP_ID", "0"},
                  {"SLURM_NTASKS", "8"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_TASKS_PER_NODE", "4(x2)"},
                  {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.source, LaunchEnv::Source::Slurm);
}

TEST(LaunchEnv, SlurmMasterOverride) {
  auto e = parse({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                  {"SLURM_NTASKS_PER_NODE", "1"},
                  {"SLURM_JOB_NODELIST", "a,b"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.local_world_size, 1);
}

TEST(LaunchEnv, OpenMpi) {
  auto e = parse({{"OMPI_COMM_WORLD_RANK", "1"},
                  {"OMPI_COMM_WORLD_SIZE", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one node: loopback
  EXPECT_EQ(e.source_name(), "openmpi");
}

// Without MPI built in; with it, rank 0's address is learned over MPI
// (mpi_backend_test.cpp tests both).
TEST(LaunchEnv, OpenMpiAcrossNodesNeedsAMasterAndSaysHowToPassIt) {
  if (!ddp::mpi_library_version().empty())
    GTEST_SKIP() << "this libddp has the mpi backend: the master is learned over MPI (LaunchEnvMpi tests it)";
  expect_error({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
               "-x MASTER_ADDR");
}

// A batch script that forgot srun: Slurm's variables for 2 tasks, no step.
TEST(LaunchEnv, SlurmTasksWithoutAStepAreRefused) {
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_NODELIST", "n1"}},
               "srun");
  // One task needs no step: the batch script of a one-task job trains alone.
  auto e = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(e.world_size, 1);
}

// A step on part of the allocation, with different task counts per node:
// the step's variables win over the job's, and each node counts its own.
TEST(LaunchEnv, SlurmStepVariablesFirstAndEachNodeItsOwnCount) {
  Env job{{"SLURM_STEP_ID", "3"},         {"SLURM_NTASKS", "4"},
          {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_TASKS_PER_NODE", "2(x4)"},
          {"SLURM_STEP_NODELIST", "n[3-4]"}, {"SLURM_STEP_TASKS_PER_NODE", "3,1"}};
  Env first = job, second = job;
  first.insert({{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "0"}});
  second.insert({{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"}});
  auto a = parse(first), b = parse(second);
  EXPECT_EQ(a.local_world_size, 3);
  EXPECT_EQ(b.local_world_size, 1);
  EXPECT_EQ(a.master_addr, "n3");
  EXPECT_EQ(b.master_addr, "n3");
  Env repeated = second;
  repeated["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  EXPECT_EQ(parse(repeated).local_world_size, 1);
}

TEST(LaunchEnv, MpichAndIntelMpiThroughPmi) {
  auto e = parse({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.source_name(), "pmi");
  // Across nodes, or when the node's count is unknown, the master must be given.
  expect_error({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}},
               "-genv MASTER_ADDR");
  expect_error({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, "MASTER_ADDR");
  expect_error({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}}, "PMI_RANK");
}

TEST(LaunchEnv, RankFromEnvironmentFollowsThePrecedence) {
  const char* names[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved[n] = v; else saved[n] = std::nullopt;
    ::unsetenv(n);
  }
  EXPECT_EQ(ddp::rank_from_environment(), "0");
  ::setenv("PMI_RANK", "7", 1);
  EXPECT_EQ(ddp::rank_from_environment(), "7");
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  EXPECT_EQ(ddp::rank_from_environment(), "5");
  ::setenv("RANK", "3", 1);
  EXPECT_EQ(ddp::rank_from_environment(), "3");
  for (const auto& [n, v] : saved) {
    if (v) ::setenv(n.c_str(), v->c_str(), 1); else ::unsetenv(n.c_str());
  }
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  auto with = [](std::string k, std::string v) {
    Env e = torchrun;
    e[k] = v;
    return e;
  };
  auto without = [](std::string k) {
    Env e = torchrun;
    e.erase(k);
    return e;
  };
  expect_error(with("RANK", "8"), "RANK");               // rank >= world size
  expect_error(with("RANK", "-1"), "RANK");
  expect_error(with("RANK", "two"), "RANK");             // non-numeric
  expect_error(with("WORLD_SIZE", "4x"), "WORLD_SIZE");
  expect_error(with("WORLD_SIZE", "0"), "WORLD_SIZE");
  expect_error(with("LOCAL_RANK", "2"), "LOCAL_RANK");   // >= local world size
  expect_error(with("LOCAL_WORLD_SIZE", "9"), "LOCAL_WORLD_SIZE");
  expect_error(with("MASTER_PORT", "70000"), "MASTER_PORT");
  expect_error(with("MASTER_PORT", "0"), "MASTER_PORT");
  expect_error(with("MASTER_PORT", ""), "MASTER_PORT");
  expect_error(with("MASTER_ADDR", ""), "MASTER_ADDR");
  expect_error(without("MASTER_ADDR"), "MASTER_ADDR");   // no master with world size > 1
  expect_error(without("MASTER_PORT"), "MASTER_PORT");
  expect_error(without("WORLD_SIZE"), "WORLD_SIZE");
  const Env step{{"SLURM_STEP_ID", "0"}};
  auto in_step = [&](Env e) {
    e.insert(step.begin(), step.end());
    return e;
  };
  expect_error(in_step({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}), "SLURM_PROCID");
  expect_error(
      in_step({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_NODELIST", "n[1-"}}),
      "SLURM_JOB_NODELIST");
  expect_error(in_step({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), "SLURM_LOCALID");
  for (const char* bad : {"4(x2", "4(2)", "x", "", "4,", "0", "4(x0)"})
    expect_error(in_step({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                          {"SLURM_STEP_TASKS_PER_NODE", bad}}),
                 "SLURM_STEP_TASKS_PER_NODE");
  expect_error({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK");
}

// Jobs sharing a node: each Slurm step or Open MPI job has its own id, and
// without MASTER_PORT its own port; an explicit MASTER_PORT still wins.
TEST(LaunchEnv, JobIdAndTheDefaultPortComeFromTheJob) {
  Env slurm{{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "2"}, {"SLURM_JOB_ID", "4711"}, {"SLURM_NTASKS", "2"},
            {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "n1"}};
  auto e = parse(slurm);
  EXPECT_EQ(e.job_id, "slurm:4711.2");
  EXPECT_EQ(e.master_port, ddp::default_port_for_job("slurm:4711.2"));
  slurm["SLURM_JOB_ID"] = "4712";
  EXPECT_NE(parse(slurm).master_port, e.master_port);
  slurm["MASTER_PORT"] = "29400";
  EXPECT_EQ(parse(slurm).master_port, 29400);

  auto mpi = parse({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-host-123@1"}});
  EXPECT_EQ(mpi.job_id, "mpi:prterun-host-123@1");
  EXPECT_EQ(mpi.master_port, ddp::default_port_for_job(mpi.job_id));
  EXPECT_EQ(parse(torchrun).job_id, "");
}

// What ddprun asks to check that srun started it once per node: the same
// reading LaunchEnv's Slurm source uses, with the variable it came from.
TEST(LaunchEnv, SlurmTasksOnNodeNamesItsVariable) {
  auto tasks = [](const Env& env) {
    return ddp::slurm_tasks_on_node([&](const std::string& k) -> std::optional<std::string> {
      auto it = env.find(k);
      if (it == env.end()) return std::nullopt;
      return it->second;
    });
  };
  EXPECT_FALSE(tasks({}));
  auto step = tasks({{"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "1,2(x2)"}, {"SLURM_NTASKS_PER_NODE", "8"}});
  ASSERT_TRUE(step);
  EXPECT_EQ(step->count, 2);
  EXPECT_EQ(step->from, "SLURM_STEP_TASKS_PER_NODE");
  auto job = tasks({{"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4,3"}});
  ASSERT_TRUE(job);
  EXPECT_EQ(job->count, 3);
  EXPECT_EQ(job->from, "SLURM_TASKS_PER_NODE");
  EXPECT_THROW(tasks({{"SLURM_STEP_TASKS_PER_NODE", "x"}}), ddp::LaunchEnvError);
}
