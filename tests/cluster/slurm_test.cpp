// The Slurm job templates (deploy/slurm/) on a real two-node Slurm cluster:
// munged, slurmctld and two slurmd, each node in its own network namespace
// with its own address and host name (tests/cluster/slurm_cluster.sh). Each
// test brings up a cluster of its own, submits with sbatch and trains the
// LeNet example across the two nodes (2 workers in all). Needs root and
// Debian's slurm-wlm and munge (deploy/install-deps.sh); skips with the reason
// otherwise. The cluster is taken down on every path, and one left by a
// killed test is swept by the next.
#include <dirent.h>
#include <sys/stat.h>

#include <optional>

#include "../support/located.h"
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

// Exit status of slurm_cluster.sh when this machine cannot run a cluster.
constexpr int kCannotRunHere = 77;

const std::string kPerNode = "ddprun-per-node.sbatch";
const std::string kPerTask = "srun-per-task.sbatch";

struct ProcessInfo {
  pid_t pid;
  std::string exe;      // the executable's file name
  std::string cmdline;  // as /proc shows it: NUL-separated, a process title as set
  std::map<std::string, std::string> env;
};

// The network namespace a path names (/run/netns/NS, /proc/PID/ns/net), or 0.
ino_t netns_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Every process on the cluster's nodes (network namespaces `nodes`): tests
// running side by side have clusters of their own, with job ids of their own.
std::vector<ProcessInfo> processes_on(const std::set<ino_t>& nodes) {
  std::vector<ProcessInfo> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string proc = "/proc/" + std::string(e->d_name);
    if (!nodes.count(netns_of(proc + "/ns/net"))) continue;
    ProcessInfo p{pid, "", read_file(proc + "/cmdline"), {}};
    const std::string env = read_file(proc + "/environ");
    for (size_t start = 0; start < env.size();) {
      size_t end = env.find('\0', start);
      if (end == std::string::npos) end = env.size();
      const std::string kv = env.substr(start, end - start);
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) p.env[kv.substr(0, eq)] = kv.substr(eq + 1);
      start = end + 1;
    }
    std::error_code ec;
    p.exe = fs::read_symlink(proc + "/exe", ec).filename().string();
    out.push_back(std::move(p));
  }
  ::closedir(d);
  return out;
}

std::string tail_of(const std::string& text, size_t lines) {
  auto all = lines_of(text);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += all[i] + "\n";
  return out;
}

class SlurmTemplates : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: a Slurm cluster in network namespaces";
    Process({"/bin/bash", kScript, "sweep"}, {}, dir_).wait(60);  // clusters of tests that died
    cluster_ = dir_ + "/cluster";
    Result up =
        Process({"/bin/bash", kScript, "up", cluster_}, {{"DDP_CLUSTER_OWNER", std::to_string(::getpid())}}, dir_)
            .wait(120);
    if (up.code == kCannotRunHere) GTEST_SKIP() << up.err;
    ASSERT_EQ(up.code, 0) << "the cluster did not come up:\n" << up.err << up.out;
    started_ = true;
    for (const auto& line : lines_of(up.out))
      if (line.rfind("DDP_CLUSTER_NS", 0) == 0) nodes_.insert(netns_of("/run/netns/" + line.substr(line.find('=') + 1)));
    ASSERT_EQ(nodes_.size(), 2u) << up.out;
    fs::create_directories(dir_ + "/out");
  }

  void TearDown() override {
    if (started_) {
      if (HasFailure())
        for (const char* log : {"slurmctld.log", "slurmd-node1.log", "slurmd-node2.log"})
          std::cerr << "---- " << log << " (last lines)\n" << tail_of(read_file(cluster_ + "/log/" + log), 15);
      Result down = Process({"/bin/bash", kScript, "down", cluster_}, {}, dir_).wait(120);
      EXPECT_EQ(down.code, 0) << down.err;
    }
    LauncherTest::TearDown();
  }

  // A command on node1, the cluster's login node.
  std::unique_ptr<Process> on_login_node(const std::vector<std::string>& command) {
    std::vector<std::string> argv{"/bin/bash", kScript, "exec", cluster_};
    argv.insert(argv.end(), command.begin(), command.end());
    return std::make_unique<Process>(argv, Env{{"DDPRUN", std::string(DDPRUN_BIN)}}, dir_);
  }

  // sbatch --wait TEMPLATE over both nodes, one worker on each, training
  // LeNet into the run folder `run`.
  std::unique_ptr<Process> submit(const std::string& tmpl, const std::string& run, int epochs, int batches) {
    return on_login_node({"sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                          "--output=" + dir_ + "/out/%j.out", std::string(DDP_SOURCE_DIR) + "/deploy/slurm/" + tmpl,
                          LENET_BIN, "--run-dir", run_dir(run), "--epochs", std::to_string(epochs), "--limit-batches",
                          std::to_string(batches), "--global-batch-size", "64", "--timeout", "120"});
  }

  std::string run_dir(const std::string& run) const { return dir_ + "/" + run; }
  std::string run_log(const std::string& run) const { return read_file(run_dir(run) + "/log.txt"); }
  std::string job_output(const std::string& job) const { return read_file(dir_ + "/out/" + job + ".out"); }

  // The cluster is the test's own: its one job is the one submitted.
  std::string the_job() {
    std::string id;
    wait_for(
        [&] {
          id = on_login_node({"squeue", "-h", "-o", "%i"})->wait(60).out;
          id.erase(std::remove_if(id.begin(), id.end(), ::isspace), id.end());
          return !id.empty();
        },
        60);
    return id;
  }

  // "JobState=RUNNING ... Restarts=0 ... ExitCode=0:0 ..." from the controller.
  std::string job_info(const std::string& job) { return on_login_node({"scontrol", "show", "job", job})->wait(60).out; }
  // The job's state once it has left COMPLETING (its steps ending on the
  // nodes, longer on a loaded machine): its final one.
  std::string final_job_info(const std::string& job) {
    std::string info;
    EXPECT_TRUE(wait_for(
        [&] {
          info = job_info(job);
          return info.find("JobState=COMPLETING") == std::string::npos;
        },
        60))
        << info;
    return info;
  }

  // The example's processes in `job` (not ddprun's, srun's or the shell's), by rank.
  std::map<std::string, pid_t> workers_of(const std::string& job) {
    std::map<std::string, pid_t> out;
    for (auto& p : processes_of(job)) {
      if (p.exe != fs::path(LENET_BIN).filename().string()) continue;
      out[p.env.count("RANK") ? p.env["RANK"] : p.env["SLURM_PROCID"]] = p.pid;
    }
    return out;
  }

  // The slurmstepd processes of `job` on the cluster's nodes (their title
  // is "slurmstepd: [JOB.STEP]").
  std::vector<pid_t> stepds_of(const std::string& job) {
    std::vector<pid_t> out;
    for (const auto& p : processes_on(nodes_))
      if (p.cmdline.rfind("slurmstepd: [" + job + ".", 0) == 0) out.push_back(p.pid);
    return out;
  }

  // Both nodes idle: no job on them, none still completing.
  bool nodes_idle() {
    const std::string states = on_login_node({"sinfo", "-h", "-N", "-o", "%N %t"})->wait(60).out;
    return states.find("node1 idle\n") != std::string::npos && states.find("node2 idle\n") != std::string::npos;
  }

  // Both workers running, and rank 0 past its start-up.
  bool training(const std::string& job, const std::string& run) {
    return workers_of(job).size() == 2 && run_log(run).find("samples per step") != std::string::npos;
  }

  // A successful run of `epochs` epochs across both nodes, both ranks seen.
  void expect_trained(const std::string& run, int epochs, const std::string& output) {
    const std::string log = run_log(run);
    EXPECT_NE(log.find("2 x 32 samples per step"), std::string::npos) << log;
    EXPECT_NE(log.find("epoch " + std::to_string(epochs) + ": train loss"), std::string::npos) << log;
    EXPECT_NE(log.find("best test acc"), std::string::npos) << log;
    EXPECT_TRUE(fs::exists(run_dir(run) + "/model.pt"));
    EXPECT_EQ(lines_of(read_file(run_dir(run) + "/metrics.csv")).size(), static_cast<size_t>(epochs) + 1);
    // Every rank's own lines, one rank on each node (Slurm may place rank 0 on either).
    const bool in_order = output.find("rank 0 of 2 on node1") != std::string::npos &&
                          output.find("rank 1 of 2 on node2") != std::string::npos;
    const bool swapped = output.find("rank 0 of 2 on node2") != std::string::npos &&
                         output.find("rank 1 of 2 on node1") != std::string::npos;
    EXPECT_TRUE(in_order || swapped) << "no 'rank R of 2 on nodeN' line from each rank on its own node:\n" << output;
  }

  inline static const std::string kScript = std::string(DDP_SOURCE_DIR) + "/tests/cluster/slurm_cluster.sh";
  // The processes of `job` on the cluster's nodes: SLURM_JOB_ID=job in their environment.
  std::vector<ProcessInfo> processes_of(const std::string& job) {
    std::vector<ProcessInfo> out;
    for (auto& p : processes_on(nodes_))
      if (p.env["SLURM_JOB_ID"] == job) out.push_back(std::move(p));
    return out;
  }

  std::string cluster_;
  std::set<ino_t> nodes_;  // the nodes' network namespaces
  bool started_ = false;
};

class EachTemplate : public SlurmTemplates, public ::testing::WithParamInterface<std::string> {};

TEST_P(EachTemplate, TrainsAcrossTwoNodes) {
  Result r = submit(GetParam(), "run", 2, 6)->wait(240);
  std::string output;  // the job's one output file
  for (const auto& e : fs::directory_iterator(dir_ + "/out")) output += read_file(e.path().string());
  EXPECT_EQ(r.code, 0) << r.out << r.err << output;
  expect_trained("run", 2, output);
}

TEST_P(EachTemplate, AKilledRankFailsTheJobWithItsCode) {
  auto sbatch = submit(GetParam(), "run", 100, 1000);
  const std::string job = the_job();
  ASSERT_FALSE(job.empty()) << "no job appeared in squeue";
  ASSERT_TRUE(wait_for([&] { return training(job, "run"); }, 180)) << job_output(job) << run_log("run");
  const pid_t victim = workers_of(job)["1"];
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  Result r = sbatch->wait(180);
  // sbatch --wait returns while the job may still be COMPLETING.
  const std::string info = final_job_info(job);
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.out << r.err << job_output(job);
  EXPECT_NE(info.find("ExitCode=137:0"), std::string::npos) << info;
  EXPECT_NE(info.find("JobState=FAILED"), std::string::npos) << info;
  // --kill-on-bad-exit: nothing of the job lives on, on either node.
  EXPECT_TRUE(wait_for([&] { return processes_of(job).empty(); }, 60));
}

TEST_P(EachTemplate, ACancelledJobLeavesNothingBehind) {
  auto sbatch = submit(GetParam(), "run", 100, 1000);
  const std::string job = the_job();
  ASSERT_FALSE(job.empty()) << "no job appeared in squeue";
  ASSERT_TRUE(wait_for([&] { return training(job, "run"); }, 180)) << job_output(job) << run_log("run");
  Result cancel = on_login_node({"scancel", job})->wait(60);
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  Result r = sbatch->wait(120);
  EXPECT_NE(r.code, 0) << "a cancelled job reported success";
  std::vector<ProcessInfo> left;
  EXPECT_TRUE(wait_for(
      [&] {
        left = processes_of(job);
        return left.empty();
      },
      60));
  for (const auto& p : left) ADD_FAILURE() << "left behind: pid " << p.pid << " (" << p.exe << ")";
  // The job may still be COMPLETING after its processes ended.
  const std::string info = final_job_info(job);
  EXPECT_NE(info.find("JobState=CANCELLED"), std::string::npos) << info;
}

TEST_P(EachTemplate, APreemptionWarningCheckpointsRequeuesAndResumes) {
  auto sbatch = submit(GetParam(), "run", 3, 40);
  const std::string job = the_job();
  ASSERT_FALSE(job.empty()) << "no job appeared in squeue";
  ASSERT_TRUE(wait_for([&] { return training(job, "run"); }, 180)) << job_output(job) << run_log("run");
  // The warning a preemption policy or --signal=USR1@T sends to the steps.
  Result warn = on_login_node({"scancel", "--signal=USR1", job})->wait(60);
  ASSERT_EQ(warn.code, 0) << warn.err;
  // Requeued (Restarts=1), started again and finished. Slurm holds a
  // requeued job for about two minutes before it may start, time for the
  // nodes to end the first run; an operator's StartTime=now lets it start as
  // soon as they have, as here. Released earlier, the launch is refused: the
  // first run's slurmstepd still runs, and its credential was revoked in the
  // same second (Slurm compares whole seconds).
  std::string info;
  bool released = false;
  std::optional<std::chrono::steady_clock::time_point> requeued;
  EXPECT_TRUE(wait_for(
      [&] {
        info = job_info(job);
        const bool pending = info.find("Restarts=1") != std::string::npos &&
                             info.find("JobState=PENDING") != std::string::npos;
        if (pending && !requeued) requeued = std::chrono::steady_clock::now();
        if (!released && pending && std::chrono::steady_clock::now() - *requeued > std::chrono::seconds(2) &&
            processes_of(job).empty() && stepds_of(job).empty() && nodes_idle())
          released = on_login_node({"scontrol", "update", "JobId=" + job, "StartTime=now"})->wait(60).code == 0;
        return info.find("JobState=COMPLETED") != std::string::npos || info.find("JobState=FAILED") != std::string::npos;
      },
      300))
      << info;
  Result r = sbatch->wait(60);
  EXPECT_EQ(r.code, 0) << "sbatch --wait follows the requeue to the job's end: " << r.out << r.err;
  const std::string output = job_output(job), log = run_log("run");
  EXPECT_NE(info.find("JobState=COMPLETED"), std::string::npos) << info << output;
  EXPECT_NE(info.find("Restarts=1"), std::string::npos) << info;
  EXPECT_NE(output.find("preempted with a checkpoint; requeueing"), std::string::npos) << output;
  EXPECT_NE(log.find("preemption warning"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + run_dir("run") + "/checkpoint after"), std::string::npos) << log;
  EXPECT_NE(log.find("SLURM_RESTART_COUNT=1"), std::string::npos) << log;
  expect_trained("run", 3, output);
}

// A request no node can meet (here 4096 CPUs a node) pends forever under
// plain sbatch (Reason=PartitionConfig) and never runs the template, so the
// template cannot say so; deploy/slurm/submit.sh asks Slurm first (sbatch
// --test-only), fails with the reason and the nodes' sizes, and submits
// nothing; a request that fits it submits as sbatch does. With
// EnforcePartLimits=ALL (docs/clusters.md) sbatch itself refuses.
TEST_F(SlurmTemplates, SubmitRefusesARequestNoNodeCanMeetInsteadOfPendingForever) {
  const std::string slurm_dir = std::string(DDP_SOURCE_DIR) + "/deploy/slurm/";
  const std::string submit_sh = slurm_dir + "submit.sh", output = "--output=" + dir_ + "/out/%j.out";
  auto queued = [&] { return on_login_node({"squeue", "-h", "-o", "%i %r"})->wait(60).out; };

  Result plain = on_login_node({"sbatch", "--cpus-per-task=4096", output, slurm_dir + kPerNode, LENET_BIN})->wait(60);
  ASSERT_EQ(plain.code, 0) << "sbatch refused it by itself:\n" << plain.err;
  const std::string job = the_job();
  std::string why;
  EXPECT_TRUE(wait_for([&] { return (why = queued()).find("PartitionConfig") != std::string::npos; }, 30)) << why;
  on_login_node({"scancel", job})->wait(60);
  ASSERT_TRUE(wait_for([&] { return queued().empty(); }, 60));

  Result refused = on_login_node({submit_sh, "--cpus-per-task=4096", output, slurm_dir + kPerNode, LENET_BIN})->wait(60);
  EXPECT_EQ(refused.code, 1) << refused.out << refused.err;
  for (const std::string& said : {"submit: Slurm would never start this job: Requested node configuration is not available",
                                  "--cpus-per-task", "CPUS", "Nothing was submitted"})
    EXPECT_NE(refused.err.find(said), std::string::npos) << "missing '" << said << "' in:\n" << refused.err;
  EXPECT_EQ(queued(), "") << "submit.sh submitted it";

  Result fits = on_login_node({submit_sh, "--wait", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", output,
                               slurm_dir + kPerTask, "/bin/true"})
                    ->wait(120);
  EXPECT_EQ(fits.code, 0) << fits.out << fits.err;
  EXPECT_NE(fits.out.find("Submitted batch job"), std::string::npos) << fits.out;

  std::ofstream(cluster_ + "/slurm.conf", std::ios::app) << "EnforcePartLimits=ALL\n";
  ASSERT_EQ(on_login_node({"scontrol", "reconfigure"})->wait(60).code, 0);
  Result enforced = on_login_node({"sbatch", "--cpus-per-task=4096", output, slurm_dir + kPerNode, LENET_BIN})->wait(60);
  EXPECT_NE(enforced.code, 0) << enforced.out;
  EXPECT_NE(enforced.err.find("More processors requested than permitted"), std::string::npos) << enforced.err;
  EXPECT_EQ(queued(), "");
}

INSTANTIATE_TEST_SUITE_P(Slurm, EachTemplate, ::testing::Values(kPerNode, kPerTask),
                         [](const auto& info) { return info.param == kPerNode ? "DdprunPerNode" : "SrunPerTask"; });

}  // namespace
}  // namespace ddprun_test
