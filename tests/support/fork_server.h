// The tests' side of the rank fork server (tests/support/rank_fork.cpp): a
// C++ rank program started once, with the forker preloaded, that forks the
// jobs of every test sharing its program and environment, so that LibTorch's
// initializers (0.5 s of CPU) are paid once per program rather than once per
// test. run_ranks (multiprocess.h) asks it for a job; anything that fails
// here (no server, a socket that does not answer) makes run_ranks start the
// program itself, as before.
//
// A server's socket is /tmp/ddp-rank-fork-<uid>/<key>.sock, the key a hash
// of the program (its path, inode, size and time), the forker's file, and
// every variable but those that place one job (its folder, port, ranks): a
// rebuilt program or another environment gets a server of its own, started
// with that environment, so its initializers see what a fresh start would.
// DDP_TEST_FORK_SERVER=0 turns it off.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ddp::testing {

// A job the server started: its connection (the exit code comes on it) and process id.
struct ServerJob {
  int fd = -1;
  pid_t pid = -1;
};

// The variables that place one job, which a server's environment leaves out.
inline bool places_one_job(const std::string& name) {
  for (const char* v : {"DDP_TEST_FORK_RANKS", "DDP_TEST_DIR", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                        "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LD_PRELOAD"})
    if (name == v) return true;
  return false;
}

// The variables a server for `all_env` starts with: all but those that place one job.
inline std::vector<std::string> server_variables(const std::map<std::string, std::string>& all_env) {
  std::vector<std::string> vars;
  for (const auto& [k, v] : all_env)
    if (!places_one_job(k)) vars.push_back(k + "=" + v);
  return vars;
}

// LD_PRELOAD with `forker` first, before what this process preloads.
inline std::string preload_with(const std::string& forker) {
  const char* preload = std::getenv("LD_PRELOAD");
  return forker + (preload && *preload ? std::string(":") + preload : "");
}

inline std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

// The job's whole environment: this process's, with `env` over it (as spawn gives a child).
inline std::map<std::string, std::string> job_environment(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> all;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) all[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) all[k] = v;
  return all;
}

// "<length>:<text>", as rank_fork.cpp reads it.
inline std::string framed(const std::string& s) { return std::to_string(s.size()) + ":" + s; }

inline std::string job_request(const std::string& program, const std::vector<std::string>& args,
                               const std::map<std::string, std::string>& all_env) {
  std::string body = framed(std::to_string(args.size() + 1)) + framed(program);
  for (const auto& a : args) body += framed(a);
  size_t count = 0;
  std::string vars;
  for (const auto& [k, v] : all_env)
    if (k != "LD_PRELOAD") vars += framed(k + "=" + v), ++count;
  body += framed(std::to_string(count)) + vars;
  char cwd[4096];
  body += framed(::getcwd(cwd, sizeof cwd) ? cwd : "/");
  return std::to_string(body.size()) + "\n" + body;
}

// The server's socket for `program` run with `all_env`, "" when it cannot have one.
inline std::string server_socket(const std::string& program, const std::string& forker,
                                 const std::map<std::string, std::string>& all_env) {
  std::string identity = program + "|" + file_identity(program) + "|" + file_identity(forker);
  for (const auto& v : server_variables(all_env)) identity += "|" + v;
  const std::string dir = "/tmp/ddp-rank-fork-" + std::to_string(::getuid());
  ::mkdir(dir.c_str(), 0700);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077))
    return "";
  char key[17];
  std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>{}(identity));
  return dir + "/" + key + ".sock";
}

// Connects without waiting (a server whose backlog is full is no server
// here); sends then time out after 30 s.
inline int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof addr.sun_path) return -1;
  std::strcpy(addr.sun_path, path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    timeval send_timeout{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    return fd;
  }
  const int why = errno;
  ::close(fd);
  errno = why;
  return -1;
}

// Starts a server for `program` with the job environment less what places the
// job, in a session of its own and not as this process's child, so that it
// outlives the test and holds none of its output.
inline void start_server(const std::string& program, const std::string& forker, const std::string& socket,
                         const std::map<std::string, std::string>& all_env) {
  std::vector<std::string> vars = server_variables(all_env);
  vars.push_back("LD_PRELOAD=" + preload_with(forker));
  vars.push_back("DDP_TEST_RANK_FORK_SERVER=" + socket);
  // Everything made before the fork: a test may have threads, and its child
  // must not allocate.
  std::vector<char*> env;
  for (auto& v : vars) env.push_back(v.data());
  env.push_back(nullptr);
  const std::string log_path = socket + ".log";
  char* argv[] = {const_cast<char*>(program.c_str()), nullptr};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    const int null = ::open("/dev/null", O_RDWR);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(null, 0);
    ::dup2(log >= 0 ? log : null, 1);
    ::dup2(log >= 0 ? log : null, 2);
    ::syscall(SYS_close_range, 3u, ~0u, 0u);  // nothing of the test's stays open in the server
    ::execve(argv[0], argv, env.data());
    ::_exit(127);
  }
  if (pid > 0) ::waitpid(pid, nullptr, 0);
}

// Reads "<word> <number>\n" from the server within `deadline`; false at the deadline or on a closed connection.
inline bool read_reply(int fd, const std::string& word, long& number,
                       std::chrono::steady_clock::time_point deadline) {
  std::string line;
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return false;
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.rfind(word + " ", 0) != 0) return false;
    number = std::strtol(line.c_str() + word.size() + 1, nullptr, 10);
    return true;
  }
  return false;
}

// Asks the server for `program` (started first if none answers) to run a job;
// {-1, -1} when there is no server to ask.
inline ServerJob start_server_job(const std::string& program, const std::vector<std::string>& args,
                                  const std::map<std::string, std::string>& env, const std::string& forker) {
  const char* off = std::getenv("DDP_TEST_FORK_SERVER");
  if (off && std::string(off) == "0") return {};
  const auto all_env = job_environment(env);
  const std::string socket = server_socket(program, forker, all_env);
  if (socket.empty()) return {};
  int fd = connect_to(socket);
  if (fd < 0) {
    if (errno == ECONNREFUSED) ::unlink(socket.c_str());  // a server that ended
    start_server(program, forker, socket, all_env);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (fd < 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      fd = connect_to(socket);
    }
    if (fd < 0) return {};
  }
  const std::string request = job_request(program, args, all_env);
  long pid = -1;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()) ||
      !read_reply(fd, "pid", pid, std::chrono::steady_clock::now() + std::chrono::seconds(30)) || pid <= 1) {
    ::close(fd);
    return {};
  }
  return {fd, static_cast<pid_t>(pid)};
}

// Waits for the job's exit code (128+signal when killed); once `deadline`
// has passed, kills the job's process group, once, and goes on waiting.
inline int wait_server_job(const ServerJob& job, std::chrono::steady_clock::time_point deadline) {
  long code = -1;
  if (!read_reply(job.fd, "exit", code, deadline)) {
    ::kill(-job.pid, SIGKILL);
    if (!read_reply(job.fd, "exit", code, std::chrono::steady_clock::now() + std::chrono::seconds(30)))
      code = 128 + SIGKILL;
  }
  ::close(job.fd);
  return static_cast<int>(code);
}

}  // namespace ddp::testing
