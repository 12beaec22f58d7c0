// Loaded with LD_PRELOAD into a rank program by run_ranks
// (tests/support/multiprocess.h): starts ranks 0..WORLD_SIZE-1 as processes
// forked from one that has loaded its libraries, instead of one exec each.
// A program linked with LibTorch spends about 0.7 s of CPU before main (the
// initializers that register its operators), more than many tests' work.
//
// It wraps the program's main: glibc's __libc_start_main runs every
// initializer, then the wrapper, which forks one child per rank (RANK and
// LOCAL_RANK set, stdout and stderr to <folder>/rank<r>.log) that goes on
// into the real main, while the parent waits and writes each rank's exit
// code to <folder>/rank<r>.exit (128+signal when killed), then exits 0;
// each rank's process id is in <folder>/rank<r>.pid while it runs (its
// /proc/<pid>/environ shows the variables it was started with, not RANK).
// The folder is DDP_TEST_FORK_RANKS; without it the program runs as
// usual. (A job of the fork server below is the same, but its ranks'
// /proc/<pid>/environ shows the server's variables.) Neither variable nor LD_PRELOAD reaches the ranks' own children.
// Should an initializer have started a thread (fork copies only the caller),
// each rank execs the program afresh instead.
//
// A forked rank ends as it began, without the initializers' work: the exit
// handlers registered before main (the destructors of every static object
// the initializers made: LibTorch's deregister its operators, 0.1-0.2 s of
// CPU in a forked rank, whose pages they copy) do not run. Those registered
// once main has begun (libddp's shutdown of the groups still up, the
// function-local statics main made) run as exit() runs them, last first,
// when main returns or the program calls exit(); then the output is flushed
// and the rank ends with main's code. Not run either: the main thread's
// thread_local destructors. A program started by itself (no fork, the
// sanitized build, DDP_TEST_EXEC_EACH_RANK=1) runs every handler.
//
// With DDP_TEST_RANK_FORK_SERVER naming a socket, the program is instead a
// fork server (tests/support/fork_server.h starts it, and sends it jobs):
// it pays the initializers once for every job of the tests that share its
// program and environment. Each job is a child of its own process group,
// with the environment, arguments and working folder the test sent, its
// output in <folder>/ranks.log, and forks its ranks as above; the server
// tells the test the job's process id, then its exit code, and kills the
// job should the test go away first. It ends once no job has come for
// kIdleSeconds, or when its socket is gone.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using Main = int (*)(int, char**, char**);
Main real_main = nullptr;

// ---- A forked rank's exit handlers ----

struct ExitHandler {
  void (*fn)(void*);
  void* arg;
  void* dso;
};
std::atomic<bool> in_rank{false};  // set in a forked rank as its main begins
std::mutex handlers_mutex;
std::vector<ExitHandler>* handlers = nullptr;  // left alone at the end: nothing of ours is destroyed

// Runs the handlers registered since main began (those of `dso` alone
// unless it is null), last first; a handler may register more.
void run_handlers(void* dso) {
  for (;;) {
    ExitHandler h{};
    {
      std::lock_guard<std::mutex> lock(handlers_mutex);
      auto it = handlers->rbegin();
      while (it != handlers->rend() && dso && it->dso != dso) ++it;
      if (it == handlers->rend()) return;
      h = *it;
      handlers->erase(std::next(it).base());
    }
    h.fn(h.arg);
  }
}

[[noreturn]] void end_rank(int code) {
  run_handlers(nullptr);
  std::fflush(nullptr);
  ::_exit(code);
}

template <typename F>
F next_symbol(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

int thread_count() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.') ++count;
    ::closedir(dir);
  }
  return count;
}

// A wait status as a shell shows it: the exit code, or 128+signal.
int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Written whole under another name, then renamed: a reader never sees part.
void write_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  if (FILE* f = std::fopen(partial.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(partial.c_str(), path.c_str());
  }
}

void become_rank(int rank, const std::string& folder) {
  const std::string log = folder + "/rank" + std::to_string(rank) + ".log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
}

int fork_ranks(int argc, char** argv, char** envp) {
  const char* folder_env = std::getenv("DDP_TEST_FORK_RANKS");
  const char* world_env = std::getenv("WORLD_SIZE");
  if (!folder_env || !world_env) return real_main(argc, argv, envp);
  const std::string folder = folder_env;
  const int world = std::atoi(world_env);
  ::unsetenv("DDP_TEST_FORK_RANKS");
  ::unsetenv("LD_PRELOAD");
  const bool exec_each = thread_count() > 1;
  std::fflush(nullptr);
  std::map<pid_t, int> ranks;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      become_rank(rank, folder);
      if (exec_each) {
        ::execv("/proc/self/exe", argv);
        ::_exit(127);
      }
      handlers = new std::vector<ExitHandler>();
      in_rank = true;
      end_rank(real_main(argc, argv, environ));
    }
    if (pid > 0) {
      ranks[pid] = rank;
      write_file(folder + "/rank" + std::to_string(rank) + ".pid", std::to_string(pid));
    } else {
      const std::string why = std::string("rank_fork: cannot fork rank ") + std::to_string(rank) + ": " +
                              std::strerror(errno) + "\n";
      write_file(folder + "/rank" + std::to_string(rank) + ".log", why);
      write_file(folder + "/rank" + std::to_string(rank) + ".exit", "126");
    }
  }
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    if (pid < 0) break;
    const auto it = ranks.find(pid);
    if (it == ranks.end()) continue;
    const int code = exit_code(status);
    write_file(folder + "/rank" + std::to_string(it->second) + ".exit", std::to_string(code));
    ranks.erase(it);
  }
  ::_exit(0);
}

// ---- The fork server ----

constexpr int kIdleSeconds = 10;

// A job as the test sends it: "<bytes>\n" then the strings, each
// "<length>:<text>": the count of arguments, the arguments, the count of
// variables, the variables ("K=V"), the working folder.
struct Job {
  std::vector<std::string> argv, env;
  std::string cwd;
};

bool take_string(const std::string& data, size_t& pos, std::string& out) {
  const size_t colon = data.find(':', pos);
  if (colon == std::string::npos || colon == pos || colon - pos > 9) return false;
  for (size_t i = pos; i < colon; ++i)
    if (data[i] < '0' || data[i] > '9') return false;
  const size_t length = std::strtoul(data.c_str() + pos, nullptr, 10);
  if (length > data.size() - colon - 1) return false;
  out = data.substr(colon + 1, length);
  pos = colon + 1 + length;
  return true;
}

bool take_list(const std::string& data, size_t& pos, std::vector<std::string>& out) {
  std::string count;
  if (!take_string(data, pos, count)) return false;
  const long n = std::strtol(count.c_str(), nullptr, 10);
  if (n < 0 || n > 100000) return false;
  out.resize(n);
  for (auto& item : out)
    if (!take_string(data, pos, item)) return false;
  return true;
}

// Reads one job from `fd` within 5 s in all; false on anything else.
bool read_job(int fd, Job& job) {
  constexpr size_t kMaxBytes = 64u << 20;
  const time_t until = std::time(nullptr) + 5;
  std::string data;
  size_t want = 0;
  char buf[65536];
  while (want == 0 || data.size() < want) {
    const int left_ms = static_cast<int>(until - std::time(nullptr)) * 1000;
    pollfd p{fd, POLLIN, 0};
    if (left_ms <= 0 || ::poll(&p, 1, left_ms) <= 0) return false;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.append(buf, n);
    const size_t newline = data.find('\n');
    if (want == 0 && newline == std::string::npos && data.size() > 20) return false;
    if (want == 0 && newline != std::string::npos) {
      if (newline == 0 || newline > 9 || data.find_first_not_of("0123456789") != newline) return false;
      want = std::strtoul(data.c_str(), nullptr, 10) + newline + 1;
      if (want > kMaxBytes) return false;
    }
  }
  size_t pos = data.find('\n') + 1;
  return take_list(data, pos, job.argv) && take_list(data, pos, job.env) && take_string(data, pos, job.cwd) &&
         pos == data.size() && !job.argv.empty();
}

void send_line(int fd, const std::string& line) { (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL); }

// In the forked job: becomes the program the test asked for, then forks its ranks; never returns.
[[noreturn]] void run_job(Job& job, const std::vector<int>& fds_to_close) {
  ::setpgid(0, 0);
  for (int fd : fds_to_close) ::close(fd);
  // As a fresh start has them: no signal blocked or ignored.
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::clearenv();
  for (const auto& v : job.env) ::putenv(::strdup(v.c_str()));
  const char* folder = std::getenv("DDP_TEST_FORK_RANKS");
  if (::chdir(job.cwd.c_str()) != 0 || !folder) ::_exit(126);
  const std::string log = std::string(folder) + "/ranks.log";
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || in < 0) ::_exit(126);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(out, 2);
  ::close(in);
  ::close(out);
  std::vector<char*> argv;
  for (auto& a : job.argv) argv.push_back(::strdup(a.c_str()));
  argv.push_back(nullptr);
  // fork_ranks ends the job itself; a rank comes back from the program's main.
  std::exit(fork_ranks(static_cast<int>(job.argv.size()), argv.data(), environ));
}

// Whether `path` is still the socket this server bound (inode `ino`).
bool still_ours(const char* path, ino_t ino) {
  struct stat st {};
  return ::stat(path, &st) == 0 && st.st_ino == ino;
}

int listen_on(const char* path, ino_t& ino) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || std::strlen(path) >= sizeof addr.sun_path) return -1;
  std::strcpy(addr.sun_path, path);
  // Another server that won the race holds the path: this one leaves.
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) return -1;
  struct stat st {};
  if (::stat(path, &st) != 0) return -1;
  ino = st.st_ino;
  return fd;
}

// Reaps ended jobs and tells each one's test its exit code.
void reap(std::map<pid_t, int>& jobs) {
  int status = 0;
  for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
    const auto it = jobs.find(pid);
    if (it == jobs.end()) continue;
    const int code = exit_code(status);
    send_line(it->second, "exit " + std::to_string(code) + "\n");
    ::close(it->second);
    jobs.erase(it);
  }
}

// Kills the jobs whose test has gone (its end of the connection closed).
void drop_abandoned(std::map<pid_t, int>& jobs) {
  for (auto& [pid, fd] : jobs) {
    pollfd p{fd, POLLIN, 0};
    char c;
    if (::poll(&p, 1, 0) > 0 && ((p.revents & (POLLHUP | POLLERR)) || ::recv(fd, &c, 1, MSG_DONTWAIT) == 0))
      ::kill(-pid, SIGKILL);
  }
}

void accept_job(int listener, std::map<pid_t, int>& jobs) {
  const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  Job job;
  if (!read_job(fd, job)) {
    ::close(fd);
    return;
  }
  std::vector<int> fds{listener, fd};
  for (auto& [pid, other] : jobs) fds.push_back(other);
  const pid_t pid = ::fork();
  if (pid == 0) run_job(job, fds);
  if (pid > 0) ::setpgid(pid, pid);  // as the job does itself: a kill of its group right away finds it
  if (pid < 0) {
    send_line(fd, "error fork: " + std::string(std::strerror(errno)) + "\n");
    ::close(fd);
    return;
  }
  send_line(fd, "pid " + std::to_string(pid) + "\n");
  jobs[pid] = fd;
}

[[noreturn]] void serve(const char* path) {
  ::unsetenv("DDP_TEST_RANK_FORK_SERVER");
  ::unsetenv("LD_PRELOAD");
  // A thread would be lost to every fork: no server then, and the tests
  // start the program themselves.
  if (thread_count() > 1) ::_exit(0);
  ino_t ino = 0;
  const int listener = listen_on(path, ino);
  if (listener < 0) ::_exit(0);
  std::map<pid_t, int> jobs;
  time_t last = std::time(nullptr);
  while (!jobs.empty() || (std::time(nullptr) - last < kIdleSeconds && still_ours(path, ino))) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) accept_job(listener, jobs);
    reap(jobs);
    drop_abandoned(jobs);
    if (!jobs.empty()) last = std::time(nullptr);
  }
  if (still_ours(path, ino)) {
    ::unlink(path);
    ::unlink((std::string(path) + ".log").c_str());  // its output (fork_server.h), empty but for a failure
  }
  ::_exit(0);
}

int start(int argc, char** argv, char** envp) {
  if (const char* path = std::getenv("DDP_TEST_RANK_FORK_SERVER")) serve(path);
  return fork_ranks(argc, argv, envp);
}

}  // namespace

// Where the program, its libraries and the C++ runtime register exit
// handlers (atexit() and static objects' destructors come here too), and
// where they run: a forked rank keeps those of its main for end_rank.
extern "C" int __cxa_atexit(void (*fn)(void*), void* arg, void* dso) noexcept {
  if (in_rank) {
    std::lock_guard<std::mutex> lock(handlers_mutex);
    handlers->push_back({fn, arg, dso});
    return 0;
  }
  static const auto real = next_symbol<int (*)(void (*)(void*), void*, void*)>("__cxa_atexit");
  return real(fn, arg, dso);
}

// A library unloaded (dlclose) runs its handlers first.
extern "C" void __cxa_finalize(void* dso) noexcept {
  if (in_rank && dso) run_handlers(dso);
  static const auto real = next_symbol<void (*)(void*)>("__cxa_finalize");
  real(dso);
}

extern "C" void exit(int code) noexcept {
  if (in_rank) end_rank(code);
  static const auto real = next_symbol<void (*)(int)>("exit");
  real(code);
  ::_exit(code);  // not reached
}

extern "C" int __libc_start_main(Main main, int argc, char** argv, void (*init)(), void (*fini)(),
                                 void (*rtld_fini)(), void* stack_end) {
  using Start = int (*)(Main, int, char**, void (*)(), void (*)(), void (*)(), void*);
  const auto real_start = reinterpret_cast<Start>(::dlsym(RTLD_NEXT, "__libc_start_main"));
  real_main = main;
  return real_start(start, argc, argv, init, fini, rtld_fini, stack_end);
}
