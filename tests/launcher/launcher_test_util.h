// Helpers for the launcher tests: start ddprun (or anything) as a real child
// process with its output in files, wait with a timeout, and make sure no
// process outlives a test: the test process is a child subreaper, so every
// orphan of every launcher ends up as its child and TearDown kills them all.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/located.h"
#include "../support/reserved_port.h"

extern char** environ;

namespace ddprun_test {

namespace fs = std::filesystem;
using Env = std::map<std::string, std::optional<std::string>>;  // nullopt: unset

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

inline std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> env;
  for (const auto& line : lines_of(read_file(path))) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

inline bool wait_for(const std::function<bool()>& done, double seconds = 120) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// Reaps any zombie children (orphans adopted by the test process).
inline void reap_zombies() {
  int st;
  while (::waitpid(-1, &st, WNOHANG) > 0) {
  }
}

// Alive and not a zombie.
inline bool alive(pid_t pid) {
  reap_zombies();
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      auto close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 2));
      char state;
      pid_t ppid;
      if (rest >> state >> ppid && ppid == parent) out.push_back(pid);
    }
    ::closedir(d);
  }
  return out;
}

// Kills every descendant (they are all our children: we are a subreaper);
// returns those it found, as "PID: COMMAND LINE".
inline std::vector<std::string> kill_all_children() {
  std::vector<std::string> killed;
  std::set<pid_t> seen;
  for (int round = 0; round < 50; ++round) {
    reap_zombies();
    auto kids = children_of(::getpid());
    if (kids.empty()) break;
    for (pid_t k : kids) {
      if (seen.insert(k).second) {
        std::string cmdline = read_file("/proc/" + std::to_string(k) + "/cmdline");
        std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
        killed.push_back(std::to_string(k) + ": " + cmdline);
      }
      ::kill(-k, SIGKILL);
      ::kill(k, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  reap_zombies();
  return killed;
}

// A port for ddprun (or a worker) to listen on, reserved by this process
// until it exits (tests/support/reserved_port.h): tests running at once never
// share one, and until something listens there a connection to it is refused.
inline uint16_t free_port() { return ddp::testing::reserved_port(); }

// Whether something listens on 127.0.0.1:port within `seconds` (a ddprun
// serving its store): a loaded machine starts one slowly.
inline bool listening_within(uint16_t port, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

inline bool port_listening(uint16_t port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  ::sched_getaffinity(0, sizeof set, &set);
  return CPU_COUNT(&set);
}

struct Result {
  int code = -1;  // exit code, 128+signal, or -1 on timeout
  std::string out, err;
};

// A child process with stdout/stderr in files under `dir`.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const Env& changes, const std::string& dir) {
    static int counter = 0;
    std::string base = dir + "/proc" + std::to_string(counter++);
    out_path_ = base + ".out";
    err_path_ = base + ".err";
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      std::string k = kv.substr(0, eq);
      // The tests must not pick up the machine's Slurm job or torchrun settings.
      if (k.rfind("SLURM_", 0) == 0 || k.rfind("PET_", 0) == 0 || k == "OMP_NUM_THREADS" ||
          k == "DDPRUN_TERM_TIMEOUT")
        continue;
      env[k] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : changes) {
      if (v) env[k] = *v;
      else env.erase(k);
    }
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    ::close(out);
    ::close(err);
  }
  ~Process() {
    if (pid_ > 0 && !done_) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  Result wait(double seconds = 150) {
    Result r;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int st = 0;
    for (;;) {
      pid_t p = ::waitpid(pid_, &st, WNOHANG);
      if (p == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "process " << pid_ << " did not finish within " << seconds << " s; killing it";
        ::kill(-pid_, SIGKILL);
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        done_ = true;
        r.out = read_file(out_path_);
        r.err = read_file(err_path_);
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    done_ = true;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = read_file(out_path_);
    r.err = read_file(err_path_);
    return r;
  }

  std::string current_err() const { return read_file(err_path_); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  std::string out_path_, err_path_;
};

// Base fixture: a scratch directory and the no-survivors guarantee.
class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    std::string tmpl = (fs::temp_directory_path() / "ddprun_test_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr);
    dir_ = buf.data();
  }
  void TearDown() override {
    for (const auto& left : kill_all_children()) ADD_FAILURE() << "still running at the end of the test: " << left;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string sub(const std::string& name) {
    std::string p = dir_ + "/" + name;
    fs::create_directories(p);
    return p;
  }

  // ddprun with the test worker: `flags` before, `worker_args` after.
  std::unique_ptr<Process> start(const std::vector<std::string>& flags, const std::vector<std::string>& worker_args,
                                 const Env& env = {}) {
    std::vector<std::string> argv{DDPRUN_BIN};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(TEST_WORKER_BIN);
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    return std::make_unique<Process>(argv, env, dir_);
  }
  Result run(const std::vector<std::string>& flags, const std::vector<std::string>& worker_args,
             const Env& env = {}) {
    return start(flags, worker_args, env)->wait();
  }

  std::string dir_;
};

// Where test_worker --env-dir writes rank `rank`'s environment in attempt `restart`.
inline std::string env_path(const std::string& dir, int rank, int restart) {
  return dir + "/env." + std::to_string(rank) + "." + std::to_string(restart);
}

// ddprun failed with `code` and said why in one "ddprun: error: " line holding `needle`.
inline void expect_one_error_line(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.err;
  auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("ddprun: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
}

inline std::vector<pid_t> pids_in(const std::string& dir, const std::string& prefix) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos)
      out.push_back(static_cast<pid_t>(std::atoi(read_file(e.path().string()).c_str())));
  }
  return out;
}

inline int count_files(const std::string& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) ++n;
  }
  return n;
}

inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace ddprun_test
