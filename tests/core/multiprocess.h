// Starts real worker processes for multi-rank tests: each rank gets the
// torchrun variables, its own output file, and a deadline after which the
// whole set is killed, so a test can never hang.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddp::testing {

// A port the kernel just handed out, so concurrent tests do not collide.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

struct RankResult {
  int exit_code = -1;  // 128+signal when killed
  std::string output;  // stdout and stderr together
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `program args...` as ranks 0..world-1 on loopback and waits for all,
// at most `timeout`; stragglers are killed (and reported as signal 9).
inline std::vector<RankResult> run_ranks(int world, const std::string& program, const std::vector<std::string>& args,
                                         std::map<std::string, std::string> extra_env = {},
                                         std::chrono::seconds timeout = std::chrono::seconds(240)) {
  const int port = free_port();
  // Callers that read files the ranks write pass their own DDP_TEST_DIR.
  const bool own_dir = !extra_env.count("DDP_TEST_DIR");
  char dir_template[] = "/tmp/ddp_test_XXXXXX";
  const std::string dir = own_dir ? std::string(::mkdtemp(dir_template)) : extra_env["DDP_TEST_DIR"];
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::map<std::string, std::string> env = {
        {"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
        {"OMP_NUM_THREADS", "1"},             {"DDP_TEST_DIR", dir}};
    for (auto& [k, v] : extra_env) env[k] = v;
    const std::string out = dir + "/rank" + std::to_string(rank) + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>(program.c_str())};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> results(world);
  std::vector<bool> done(world, false);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) ::kill(-pids[r], SIGKILL);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  for (int r = 0; r < world; ++r) results[r].output = read_file(dir + "/rank" + std::to_string(r) + ".log");
  if (own_dir) std::filesystem::remove_all(dir);
  return results;
}

// "rank 1 (exit 1):\n<its output>" for every rank, for assertion messages.
inline std::string describe(const std::vector<RankResult>& results) {
  std::string s;
  for (size_t r = 0; r < results.size(); ++r)
    s += "--- rank " + std::to_string(r) + " (exit " + std::to_string(results[r].exit_code) + "):\n" +
         results[r].output + "\n";
  return s;
}

}  // namespace ddp::testing
