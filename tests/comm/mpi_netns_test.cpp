// mpirun across two "hosts": two network namespaces joined by a veth pair,
// Open MPI's remote launcher pointed at an agent script (instead of ssh)
// that runs its command inside the namespace of the host it is given. One
// rank per host trains ddp_train_check with --backend gloo and no
// MASTER_ADDR (rank 0's address learned over MPI), and with --backend mpi.
// Needs root, iproute2, mpirun and a build with MPI; skips with the reason
// otherwise. Processes are killed (run_mpirun's deadline) and namespaces
// deleted on every path (RAII, and a sweep of those left by dead tests).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <random>

#include "../support/located.h"
#include "../support/multiprocess.h"

using namespace ddp::testing;

namespace {

const std::string kPrefix = "ddpmpi_t";

std::string ip_bin() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

int run(const std::vector<std::string>& argv) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Deletes namespaces named ddpmpi_t<pid>_* whose test process is gone.
void sweep_stale_namespaces(const std::string& ip) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t owner = std::atoi(name.c_str() + kPrefix.size());
    if (owner > 0 && ::kill(owner, 0) != 0) run({ip, "netns", "del", name});
  }
}

// Two namespaces "a" and "b", a veth pair between them, 10.X.Y.1 and .2/24.
// The destructor deletes both (the veth goes with them).
class NetnsHosts {
 public:
  explicit NetnsHosts(std::string ip) : ip_(std::move(ip)) {
    std::random_device rd;
    const int b = 100 + static_cast<int>(rd() % 100), c = static_cast<int>(rd() % 250);
    for (int i = 0; i < 2; ++i) {
      ns[i] = kPrefix + std::to_string(::getpid()) + "_" + (i ? "b" : "a");
      veth[i] = "dm" + std::to_string(::getpid() % 1000000) + (i ? "b" : "a");
      addr[i] = "10." + std::to_string(b) + "." + std::to_string(c) + "." + std::to_string(i + 1);
    }
    subnet = "10." + std::to_string(b) + "." + std::to_string(c) + ".0/24";
  }
  ~NetnsHosts() {
    for (int i = 0; i < 2; ++i)
      if (created_[i]) run({ip_, "netns", "del", ns[i]});
  }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // "" on success, else what failed.
  std::string create() {
    for (int i = 0; i < 2; ++i) {
      if (run({ip_, "netns", "add", ns[i]}) != 0) return "ip netns add " + ns[i] + " failed";
      created_[i] = true;
    }
    if (run({ip_, "link", "add", veth[0], "netns", ns[0], "type", "veth", "peer", "name", veth[1], "netns", ns[1]}) != 0)
      return "cannot create a veth pair";
    for (int i = 0; i < 2; ++i)
      for (const auto& cmd : std::vector<std::vector<std::string>>{
               {ip_, "-n", ns[i], "addr", "add", addr[i] + "/24", "dev", veth[i]},
               {ip_, "-n", ns[i], "link", "set", veth[i], "up"},
               {ip_, "-n", ns[i], "link", "set", "lo", "up"}})
        if (run(cmd) != 0) return "network setup in " + ns[i] + " failed";
    return "";
  }

  std::string ns[2], veth[2], addr[2], subnet;

 private:
  std::string ip_;
  bool created_[2] = {false, false};
};

class MpirunAcrossNamespaces : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!libddp_has_mpi()) GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI)";
    if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    ip_ = ip_bin();
    if (ip_.empty()) GTEST_SKIP() << "the 'ip' tool (iproute2) is not installed";
    sweep_stale_namespaces(ip_);
    hosts_ = std::make_unique<NetnsHosts>(ip_);
    const std::string err = hosts_->create();
    if (!err.empty()) {
      hosts_.reset();
      GTEST_SKIP() << "network namespaces unavailable here: " << err;
    }
    // Open MPI's rsh launcher runs `AGENT HOST orted ...` for each remote
    // host, as it would run ssh; the agent runs it in that host's namespace.
    char tmpl[] = "/tmp/ddp_mpi_agent_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    agent_ = dir_ + "/agent.sh";
    std::ofstream(agent_) << "#!/bin/sh\n"
                          << "host=$1; shift\n"
                          << "case \"$host\" in\n"
                          << "  " << hosts_->addr[0] << ") ns=" << hosts_->ns[0] << " ;;\n"
                          << "  " << hosts_->addr[1] << ") ns=" << hosts_->ns[1] << " ;;\n"
                          << "  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\n"
                          << "esac\n"
                          << "exec " << ip_ << " netns exec \"$ns\" sh -c \"$*\"\n";
    ::chmod(agent_.c_str(), 0755);
  }
  void TearDown() override {
    hosts_.reset();  // run_mpirun has killed every process of its session by now
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // mpirun in host a's namespace, one rank on each host.
  MpirunResult train(const std::string& backend) {
    const std::string hosts = hosts_->addr[0] + ":1," + hosts_->addr[1] + ":1";
    return run_mpirun(2, DDP_TRAIN_CHECK, {"--backend", backend}, {}, std::chrono::seconds(150),
                      {"--mca", "plm_rsh_agent", agent_, "--mca", "oob_tcp_if_include", hosts_->subnet, "--mca",
                       "btl_tcp_if_include", hosts_->subnet, "-H", hosts},
                      {ip_, "netns", "exec", hosts_->ns[0]});
  }

  std::string ip_, dir_, agent_;
  std::unique_ptr<NetnsHosts> hosts_;
};

}  // namespace

// No MASTER_ADDR anywhere: LaunchEnv leaves the master to be learned, the
// ranks all-gather their interfaces over MPI, and Gloo binds the veth.
TEST_F(MpirunAcrossNamespaces, GlooLearnsRankZerosAddressOverMpi) {
  auto r = train("gloo");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.ranks[0].find("rank 0/2: openmpi ok"), std::string::npos) << describe(r);
  EXPECT_NE(r.ranks[1].find("rank 1/2: openmpi ok"), std::string::npos) << describe(r);
  EXPECT_NE(r.ranks[1].find("backend gloo"), std::string::npos) << describe(r);
  // One rank per host, as Open MPI placed them: the master cannot be loopback.
  for (int rank = 0; rank < 2; ++rank) EXPECT_NE(r.ranks[rank].find("local 0/1"), std::string::npos) << describe(r);
}

TEST_F(MpirunAcrossNamespaces, MpiBackend) {
  auto r = train("mpi");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.ranks[0].find("rank 0/2: openmpi ok"), std::string::npos) << describe(r);
  EXPECT_NE(r.ranks[1].find("rank 1/2: openmpi ok"), std::string::npos) << describe(r);
  EXPECT_NE(r.ranks[1].find("backend mpi"), std::string::npos) << describe(r);
  for (int rank = 0; rank < 2; ++rank) EXPECT_NE(r.ranks[rank].find("local 0/1"), std::string::npos) << describe(r);
}
