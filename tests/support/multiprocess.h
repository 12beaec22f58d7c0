// Starts real worker processes for multi-rank tests: each rank gets the
// torchrun variables (run_ranks) or is started by a real Open MPI mpirun
// (run_mpirun), has its own output file, and a deadline after which the
// whole set is killed, so a test can never hang.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fork_server.h"
#include "located.h"
#include "reserved_port.h"

namespace ddp::testing {

// A port for a child to listen on, reserved by this process until it exits
// (tests/support/reserved_port.h): tests running at once never share one.
inline int free_port() { return reserved_port(); }

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

// Starts `program args...` with `env` added, stdout and stderr to `out`, as
// the leader of its own process group (killed as one with kill(-pid, ...)).
inline pid_t spawn(const std::string& program, const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env, const std::string& out) {
  const pid_t pid = ::fork();
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
  return pid;
}

// Waits for `pid` and returns its exit code (128+signal when killed);
// once `deadline` has passed, calls `at_deadline` (which should kill it),
// once, and goes on waiting.
inline int wait_exit_code(pid_t pid, std::chrono::steady_clock::time_point deadline,
                          const std::function<void()>& at_deadline) {
  bool called = false;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!called && std::chrono::steady_clock::now() > deadline) {
      called = true;
      at_deadline();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// How run_ranks starts a job's ranks: one process each (the program once
// per rank), or one process that forks them after the costly start-up
// (LibTorch's initializers, Python's import of torch), which it pays once:
// a C++ program with DDP_TEST_RANK_FORK_LIB preloaded
// (tests/support/rank_fork.cpp), a Python script through
// DDP_TEST_FORK_RANKS_PY (tests/support/fork_ranks.py). Either way each rank
// is a process of its own with the same variables, output file and exit
// code. The sanitized build starts each rank itself (the sanitizers' runtime
// must be the first library a program loads).
inline bool is_python(const std::string& program) {
  return std::filesystem::path(program).filename().string().rfind("python", 0) == 0;
}

// DDP_TEST_EXEC_EACH_RANK=1 in a job's variables `env`, else in the test's
// environment, starts each rank itself, as does a build whose preloaded
// library or wrapper is missing.
inline bool forks_ranks(const std::string& program, const std::map<std::string, std::string>& env = {}) {
#if defined(DDP_TEST_RANK_FORK_LIB) && defined(DDP_TEST_FORK_RANKS_PY)
  const auto set = env.find("DDP_TEST_EXEC_EACH_RANK");
  const char* each = set != env.end() ? set->second.c_str() : std::getenv("DDP_TEST_EXEC_EACH_RANK");
  if (each && *each && std::string(each) != "0") return false;
  return ::access(is_python(program) ? DDP_TEST_FORK_RANKS_PY : DDP_TEST_RANK_FORK_LIB, R_OK) == 0;
#else
  (void)program;
  (void)env;
  return false;
#endif
}

// The environment of a job whose ranks are forked into `dir`: rank 0's,
// less the variables each rank gets from the forker.
inline std::map<std::string, std::string> forking_env(std::map<std::string, std::string> env, const std::string& dir) {
  env["DDP_TEST_FORK_RANKS"] = dir;
  env.erase("RANK");
  env.erase("LOCAL_RANK");
  return env;
}

// Starts the ranks of run_ranks as one process that forks them (`env` as
// forking_env gives it); their exit codes come back in <dir>/rank<r>.exit.
inline pid_t spawn_forking(const std::string& program, const std::vector<std::string>& args,
                           std::map<std::string, std::string> env, const std::string& dir) {
#if defined(DDP_TEST_RANK_FORK_LIB) && defined(DDP_TEST_FORK_RANKS_PY)
  if (is_python(program)) {
    // The interpreter's own flags (-O) stay before the wrapper.
    std::vector<std::string> wrapped;
    size_t i = 0;
    for (; i < args.size() && !args[i].empty() && args[i][0] == '-'; ++i) wrapped.push_back(args[i]);
    wrapped.push_back(DDP_TEST_FORK_RANKS_PY);
    for (; i < args.size(); ++i) wrapped.push_back(args[i]);
    return spawn(program, wrapped, env, dir + "/ranks.log");
  }
  env["LD_PRELOAD"] = preload_with(DDP_TEST_RANK_FORK_LIB);
#endif
  return spawn(program, args, env, dir + "/ranks.log");
}

// The job of run_ranks from the rank fork server for `program`
// (fork_server.h; `env` as forking_env gives it): a C++ program only;
// {-1, -1} to start it here.
inline ServerJob fork_server_job(const std::string& program, const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& env) {
#if defined(DDP_TEST_RANK_FORK_LIB)
  if (is_python(program)) return {};
  return start_server_job(program, args, env, DDP_TEST_RANK_FORK_LIB);
#else
  (void)program, (void)args, (void)env;
  return {};
#endif
}

// What run_ranks sets for every job besides what places it (ranks, port,
// folder); the caller's variables go over it.
inline std::map<std::string, std::string> run_ranks_defaults() { return {{"OMP_NUM_THREADS", "1"}}; }

// Runs `program args...` as ranks 0..world-1 on loopback and waits for all,
// at most `timeout`; stragglers are killed (and reported as signal 9).
// DDP_TEST_EXEC_EACH_RANK=1 in `extra_env` starts each rank itself: a test
// of what a program does at its whole exit (a forked rank skips the exit
// handlers registered before main, tests/support/rank_fork.cpp).
inline std::vector<RankResult> run_ranks(int world, const std::string& program, const std::vector<std::string>& args,
                                         std::map<std::string, std::string> extra_env = {},
                                         std::chrono::seconds timeout = std::chrono::seconds(240)) {
  const int port = free_port();
  // Callers that read files the ranks write pass their own DDP_TEST_DIR.
  const bool own_dir = !extra_env.count("DDP_TEST_DIR");
  char dir_template[] = "/tmp/ddp_test_XXXXXX";
  const std::string dir = own_dir ? std::string(::mkdtemp(dir_template)) : extra_env["DDP_TEST_DIR"];
  auto rank_env = [&](int rank) {
    std::map<std::string, std::string> env = run_ranks_defaults();
    env.insert({{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
                {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
                {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
                {"DDP_TEST_DIR", dir}});
    for (auto& [k, v] : extra_env) env[k] = v;
    return env;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<RankResult> results(world);
  if (forks_ranks(program, extra_env)) {
    for (int r = 0; r < world; ++r)  // what an earlier job in the same folder left
      for (const char* what : {".exit", ".pid"}) std::filesystem::remove(dir + "/rank" + std::to_string(r) + what);
    int code = 0;
    const auto env = forking_env(rank_env(0), dir);
    const ServerJob job = fork_server_job(program, args, env);
    if (job.fd >= 0) {
      code = wait_server_job(job, deadline);
    } else {
      const pid_t pid = spawn_forking(program, args, env, dir);
      code = wait_exit_code(pid, deadline, [&] { ::kill(-pid, SIGKILL); });
    }
    for (int r = 0; r < world; ++r) {
      const std::string exit_file = read_file(dir + "/rank" + std::to_string(r) + ".exit");
      // No exit file: the rank never ended (killed with the others at the
      // deadline, 128+9) or was never started (the starter's exit code).
      results[r].exit_code = !exit_file.empty() ? std::atoi(exit_file.c_str()) : code != 0 ? code : 128 + SIGKILL;
      results[r].output = read_file(dir + "/rank" + std::to_string(r) + ".log");
    }
    if (code != 0) results[0].output += "\n[the process that forked the ranks: exit " + std::to_string(code) + "]\n" +
                                        read_file(dir + "/ranks.log");
    else if (is_python(program))  // where PyTorch's results came from: a run, or the oracle cache
      std::cout << read_file(dir + "/ranks.log") << std::flush;
    if (own_dir) std::filesystem::remove_all(dir);
    return results;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank)
    pids.push_back(spawn(program, args, rank_env(rank), dir + "/rank" + std::to_string(rank) + ".log"));
  std::vector<bool> done(world, false);
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

// Runs `program args...` (a launcher such as ddprun, not a rank: no rank
// variables are set) with `env` added, in its own process group, and waits at most
// `timeout`; at the deadline its whole group is killed (signal 9).
inline RankResult run_program(const std::string& program, const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env = {},
                              std::chrono::seconds timeout = std::chrono::seconds(240)) {
  char dir_template[] = "/tmp/ddp_prog_XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string out = dir + "/out.log";
  const pid_t pid = spawn(program, args, env, out);
  RankResult result;
  result.exit_code =
      wait_exit_code(pid, std::chrono::steady_clock::now() + timeout, [pid] { ::kill(-pid, SIGKILL); });
  result.output = read_file(out);
  std::filesystem::remove_all(dir);
  return result;
}

// The pid of a live process whose environment holds DDP_TEST_DIR=`dir` and
// RANK=`rank` (a rank started by run_ranks or by a launcher given that
// DDP_TEST_DIR), or 0.
inline pid_t find_rank_pid(const std::string& dir, int rank) {
  // A rank forked by run_ranks: its starter wrote its id (its environ shows
  // the starter's variables, or the fork server's).
  const std::string forked = read_file(dir + "/rank" + std::to_string(rank) + ".pid");
  if (!forked.empty()) {
    const pid_t pid = std::atoi(forked.c_str());
    if (pid > 0 && ::kill(pid, 0) == 0) return pid;
  }
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const pid_t pid = std::atoi(e.path().filename().c_str());
    if (pid <= 0) continue;
    std::string env = read_file(e.path().string() + "/environ");
    for (char& c : env) c = c == '\0' ? '\n' : c;
    env = "\n" + env;
    if (env.find("\nDDP_TEST_DIR=" + dir + "\n") != std::string::npos &&
        env.find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return pid;
  }
  return 0;
}

// Whether this libddp has its mpi backend (CMake found MPI), as its build
// tells the test program (DDP_WITH_MPI_BUILT): a program that only starts
// processes then need not load the library, and LibTorch with it.
inline bool libddp_has_mpi() {
#ifdef DDP_WITH_MPI_BUILT
  return true;
#else
  return false;
#endif
}

// Where mpirun is, or "" (then MPI tests skip).
inline std::string mpirun_path() {
  for (const char* p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun", "/usr/bin/orterun"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// Kills every process of session `sid` (mpirun's: its ranks get process
// groups of their own but stay in its session).
inline void kill_session(pid_t sid) {
  DIR* proc = ::opendir("/proc");
  if (!proc) return;
  while (dirent* e = ::readdir(proc)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(line.substr(paren + 2));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    fields >> state >> ppid >> pgrp >> session;
    if (session == sid) ::kill(pid, SIGKILL);
  }
  ::closedir(proc);
}

struct MpirunResult {
  int exit_code = -1;              // mpirun's: 0 iff every rank exited 0; 128+signal when killed
  bool killed_at_deadline = false;
  std::string output;              // mpirun's own stdout and stderr
  std::vector<std::string> ranks;  // each rank's stdout and stderr (--output-filename)
};

// Runs `mpirun [mpirun_args] -np world program args...` as root allows,
// oversubscribed (a 2-core machine), each rank's output in its own file, the
// environment in `env` passed with -x. At `timeout` the whole session
// (mpirun, its ranks, its remote agents) is killed.
inline MpirunResult run_mpirun(int world, const std::string& program, const std::vector<std::string>& args,
                               std::map<std::string, std::string> env = {},
                               std::chrono::seconds timeout = std::chrono::seconds(240),
                               std::vector<std::string> mpirun_args = {}, std::vector<std::string> prefix = {}) {
  char dir_template[] = "/tmp/ddp_mpirun_XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  if (!env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  std::vector<std::string> argv = prefix;
  for (const std::string& a : {mpirun_path(), std::string("--allow-run-as-root"), std::string("--oversubscribe"),
                               std::string("--output-filename"), dir + "/out"})
    argv.push_back(a);
  argv.insert(argv.end(), mpirun_args.begin(), mpirun_args.end());
  for (auto& [k, v] : env) {
    argv.push_back("-x");
    argv.push_back(k + "=" + v);
  }
  argv.push_back("-np");
  argv.push_back(std::to_string(world));
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir + "/mpirun.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  MpirunResult result;
  result.exit_code = wait_exit_code(pid, std::chrono::steady_clock::now() + timeout, [&] {
    result.killed_at_deadline = true;
    kill_session(pid);
  });
  kill_session(pid);  // ranks mpirun left behind, if any
  result.output = read_file(log);
  // Open MPI writes OUT/<job>/rank.N/{stdout,stderr}; the job is "1" for
  // the first job of an mpirun.
  std::string job_dir = dir + "/out/1";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/out", ec))
    if (e.is_directory()) job_dir = e.path().string();
  for (int r = 0; r < world; ++r) {
    const std::string rank_dir = job_dir + "/rank." + std::to_string(r);
    result.ranks.push_back(read_file(rank_dir + "/stdout") + read_file(rank_dir + "/stderr"));
  }
  std::filesystem::remove_all(dir);
  return result;
}

inline std::string describe(const MpirunResult& r) {
  std::string s = "--- mpirun (exit " + std::to_string(r.exit_code) +
                  (r.killed_at_deadline ? ", killed at the deadline" : "") + "):\n" + r.output + "\n";
  for (size_t k = 0; k < r.ranks.size(); ++k) s += "--- rank " + std::to_string(k) + ":\n" + r.ranks[k] + "\n";
  return s;
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
