// The rank fork server (fork_server.h, rank_fork.cpp) as run_ranks uses it:
// the jobs of one program and environment share one server, which outlives
// the test; another environment gets a server of its own; a job past its
// deadline is killed as one started here would be. And a rank's end, forked
// or not: the exit handlers its main registered run, and it ends with the
// code main returned or passed to exit().
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "located.h"
#include "multiprocess.h"

using namespace ddp::testing;

namespace {

#if defined(DDP_TEST_RANK_FORK_LIB)
// The socket of the server that run_ranks' jobs of DDP_WORKER with `extra` go to.
std::string socket_for(const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env = run_ranks_defaults();
  for (const auto& [k, v] : extra) env[k] = v;
  return server_socket(DDP_WORKER, DDP_TEST_RANK_FORK_LIB, job_environment(env));
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}
#endif

}  // namespace

TEST(RankForkServer, JobsOfOneProgramAndEnvironmentShareAServerThatKillsAJobAtItsDeadline) {
#if !defined(DDP_TEST_RANK_FORK_LIB)
  GTEST_SKIP() << "this build starts each rank by itself (the sanitized one)";
#else
  const char* off = std::getenv("DDP_TEST_FORK_SERVER");
  if (!forks_ranks(DDP_WORKER) || (off && std::string(off) == "0"))
    GTEST_SKIP() << "ranks are not forked by a server here (DDP_TEST_EXEC_EACH_RANK=1 or DDP_TEST_FORK_SERVER=0)";
  auto first = run_ranks(2, DDP_WORKER, {"grads"});
  for (const auto& r : first) ASSERT_EQ(r.exit_code, 0) << describe(first);
  const std::string socket = socket_for({});
  ASSERT_FALSE(socket.empty());
  const ino_t server = inode_of(socket);
  ASSERT_NE(server, 0u) << "no server at " << socket;
  const int fd = connect_to(socket);
  EXPECT_GE(fd, 0) << "the server at " << socket << " does not answer after its job";
  if (fd >= 0) ::close(fd);

  auto second = run_ranks(2, DDP_WORKER, {"grads"});
  for (const auto& r : second) ASSERT_EQ(r.exit_code, 0) << describe(second);
  EXPECT_EQ(inode_of(socket), server) << "the second job went to another server";

  const std::map<std::string, std::string> other = {{"DDP_TEST_FORK_SERVER_PROBE", "1"}};
  EXPECT_NE(socket_for(other), socket);
  auto third = run_ranks(2, DDP_WORKER, {"grads"}, other);
  for (const auto& r : third) ASSERT_EQ(r.exit_code, 0) << describe(third);
  EXPECT_NE(inode_of(socket_for(other)), 0u) << "another environment's job had no server of its own";

  // Rank 1 stops itself for 60 s inside a step, while rank 0's all-reduce
  // waits for it (the group allows 120 s): the job's deadline (3 s) comes
  // first and kills both, as run_ranks kills ranks it started itself.
  auto late = run_ranks(2, DDP_WORKER, {"stall", "--stop-seconds", "60", "--timeout", "120"}, {},
                        std::chrono::seconds(3));
  for (const auto& r : late) EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(late);
#endif
}

TEST(RankFork, ARankRunsTheExitHandlersItsMainRegisteredAndEndsWithItsCode) {
  for (const std::string code : {"0", "3"}) {
    char dir_template[] = "/tmp/ddp_test_XXXXXX";
    const std::string dir = ::mkdtemp(dir_template);
    std::vector<std::string> args{"exit_handlers"};
    if (code != "0") args.insert(args.end(), {"--exit", code});
    auto ranks = run_ranks(2, DDP_WORKER, args, {{"DDP_TEST_DIR", dir}});
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r].exit_code, std::stoi(code)) << describe(ranks);
      EXPECT_EQ(read_file(dir + "/rank" + std::to_string(r) + ".atexit"), "atexit\nstatic\n")
          << "rank " << r << ", exit code " << code;
    }
    std::filesystem::remove_all(dir);
  }
}
