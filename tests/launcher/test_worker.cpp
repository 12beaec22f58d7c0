// A worker for the launcher tests: a plain program that does what its flags
// say (write its environment, print lines, fork grandchildren, fail, trap
// signals), so each test observes ddprun through real processes.
//
//   --env-dir D        write the environment to D/env.<RANK>.<RESTART_COUNT>
//   --pid-dir D        write D/pid.<RANK>.<RESTART_COUNT> (the "ready" mark,
//                      written after any grandchildren's gc./esc. files)
//   --grandchild       fork a child that sleeps (stays in the process group)
//   --escapee          fork a child that calls setsid() and sleeps
//   --lines N --width W  print N lines of W bytes to stdout and to stderr,
//                      each written in several pieces
//   --partial          end both streams with a line without newline
//   --fail-rank R --exit C   rank R exits with C (after --wait-all)
//   --signal-self S    rank R kills itself with signal S instead
//   --wait-all         rank R first waits for every rank's pid file
//   --fail-when-file F rank R first waits (at most 180 s) for file F
//   --error-json T     rank R writes T to $TORCHELASTIC_ERROR_FILE before failing
//   --error-bytes N    rank R writes N bytes of '[' there instead
//   --error-fifo       rank R makes $TORCHELASTIC_ERROR_FILE a FIFO before failing
//   --fail-until-restart N   rank R (default 0) exits 3 while restart < N
//   --trap-dir D       on SIGTERM/SIGINT/SIGUSR1/SIGUSR2 write D/sig.<RANK> and exit 128+sig
//   --on-warning X     with --trap-dir: SIGUSR1/SIGUSR2 write D/warn.<RANK> instead,
//                      then exit with code X, or go on if X is "continue"
//   --ignore-term      ignore SIGTERM
//   --until-file F     before exiting 0, wait for file F
//   --sleep S          sleep S seconds before exiting 0 (-1: forever)
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

extern char** environ;

namespace {

int g_rank = 0;
char g_trap_path[4096];
char g_warn_path[4096];
int g_warning_exit = -1;  // --on-warning: exit with it, or -1 to go on

void write_file(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << content;
  }
  std::rename(tmp.c_str(), path.c_str());  // readers never see half a file
}

// Writes the signal's number to `path`, from a signal handler.
void note_signal(const char* path, int sig) {
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    char buf[16];
    int n = std::snprintf(buf, sizeof buf, "%d\n", sig);
    ssize_t ignored = ::write(fd, buf, static_cast<size_t>(n));
    (void)ignored;
    ::close(fd);
  }
}

void on_signal(int sig) {
  note_signal(g_trap_path, sig);
  ::_exit(128 + sig);
}

// SIGUSR1/SIGUSR2 under --on-warning: a preemption warning, noted in
// D/warn.<RANK>; then exit with the code given (75: checkpointed), or go on.
void on_warning(int sig) {
  note_signal(g_warn_path, sig);
  if (g_warning_exit >= 0) ::_exit(g_warning_exit);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Children forked after the trap is set inherit it; they get the default
// dispositions back so that only the worker itself writes its trap file.
void reset_signals() {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_DFL);
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : def;
}

void write_raw(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string env_dir, pid_dir, trap_dir, until_file, error_json, fail_when_file;
  bool error_fifo = false;
  long error_bytes = 0;
  bool grandchild = false, escapee = false, partial = false, wait_all = false, ignore_term = false;
  bool on_warning_set = false;
  int lines = 0, width = 80, fail_rank = -1, exit_code = 1, signal_self = 0, fail_until = -1;
  double sleep = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--env-dir") env_dir = next();
    else if (a == "--pid-dir") pid_dir = next();
    else if (a == "--trap-dir") trap_dir = next();
    else if (a == "--until-file") until_file = next();
    else if (a == "--fail-when-file") fail_when_file = next();
    else if (a == "--error-json") error_json = next();
    else if (a == "--error-fifo") error_fifo = true;
    else if (a == "--error-bytes") error_bytes = std::stol(next());
    else if (a == "--grandchild") grandchild = true;
    else if (a == "--escapee") escapee = true;
    else if (a == "--partial") partial = true;
    else if (a == "--wait-all") wait_all = true;
    else if (a == "--ignore-term") ignore_term = true;
    else if (a == "--lines") lines = std::stoi(next());
    else if (a == "--width") width = std::stoi(next());
    else if (a == "--fail-rank") fail_rank = std::stoi(next());
    else if (a == "--exit") exit_code = std::stoi(next());
    else if (a == "--signal-self") signal_self = std::stoi(next());
    else if (a == "--fail-until-restart") fail_until = std::stoi(next());
    else if (a == "--sleep") sleep = std::stod(next());
    else if (a == "--on-warning") {
      const std::string what = next();
      g_warning_exit = what == "continue" ? -1 : std::stoi(what);
      on_warning_set = true;
    }
    else {
      std::fprintf(stderr, "test_worker: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  g_rank = env_int("RANK", -1);
  int restart = env_int("TORCHELASTIC_RESTART_COUNT", -1);
  int world = env_int("WORLD_SIZE", 1);
  std::string tag = std::to_string(g_rank) + "." + std::to_string(restart);

  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  if (!trap_dir.empty()) {
    std::snprintf(g_trap_path, sizeof g_trap_path, "%s/sig.%d", trap_dir.c_str(), g_rank);
    // Each handler runs with every other signal blocked: ddprun's SIGTERM to
    // the rest of the group (after a first worker exited on SIGUSR1) must
    // not overwrite the trap file of a worker still in its handler.
    auto trap = [](int sig, void (*handler)(int)) {
      struct sigaction sa {};
      sa.sa_handler = handler;
      sigfillset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      ::sigaction(sig, &sa, nullptr);
    };
    for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) trap(sig, on_signal);
    if (on_warning_set) {
      std::snprintf(g_warn_path, sizeof g_warn_path, "%s/warn.%d", trap_dir.c_str(), g_rank);
      for (int sig : {SIGUSR1, SIGUSR2}) trap(sig, on_warning);
    }
  }
  if (!env_dir.empty()) {
    std::string all;
    for (char** e = environ; *e; ++e) all += std::string(*e) + "\n";
    write_file(env_dir + "/env." + tag, all);
  }
  if (grandchild) {
    pid_t pid = ::fork();
    if (pid == 0) {
      reset_signals();  // the trap is the worker's: a grandchild must not write sig.<RANK> too
      sleep_forever();
    }
    write_file(pid_dir + "/gc." + tag, std::to_string(pid));
  }
  if (escapee) {
    pid_t pid = ::fork();
    if (pid == 0) {
      reset_signals();
      ::setsid();  // leaves the worker's process group and session
      sleep_forever();
    }
    write_file(pid_dir + "/esc." + tag, std::to_string(pid));
  }
  if (lines > 0) {
    for (int i = 0; i < lines; ++i) {
      for (int fd : {1, 2}) {
        std::string line = "rank=" + std::to_string(g_rank) + " stream=" + (fd == 1 ? "out" : "err") +
                           " i=" + std::to_string(i) + " ";
        line.append(static_cast<size_t>(std::max(0, width - static_cast<int>(line.size()))), 'x');
        line += '\n';
        // Three separate writes per line: ddprun must reassemble them.
        size_t third = line.size() / 3;
        write_raw(fd, line.substr(0, third));
        write_raw(fd, line.substr(third, third));
        write_raw(fd, line.substr(2 * third));
      }
    }
    if (partial) {
      write_raw(1, "rank=" + std::to_string(g_rank) + " stream=out partial");
      write_raw(2, "rank=" + std::to_string(g_rank) + " stream=err partial");
    }
  }
  if (!pid_dir.empty()) write_file(pid_dir + "/pid." + tag, std::to_string(::getpid()));

  auto wait_for_all = [&] {
    for (int waited = 0; wait_all && waited < 1200; ++waited) {
      int ready = 0;
      for (int r = 0; r < world; ++r) ready += exists(pid_dir + "/pid." + std::to_string(r) + "." + std::to_string(restart));
      if (ready == world) break;
      sleep_s(0.1);
    }
  };
  if (fail_until >= 0 && g_rank == (fail_rank >= 0 ? fail_rank : 0)) {
    wait_for_all();
    if (restart < fail_until) return 3;
  } else if (fail_rank >= 0 && g_rank == fail_rank) {
    wait_for_all();
    for (int waited = 0; !fail_when_file.empty() && waited < 1800 && !exists(fail_when_file); ++waited) sleep_s(0.1);
    const char* error_file = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (error_file && !error_json.empty()) write_file(error_file, error_json);
    if (error_file && error_bytes > 0) write_file(error_file, std::string(static_cast<size_t>(error_bytes), '['));
    if (error_file && error_fifo) ::mkfifo(error_file, 0600);
    if (signal_self) ::kill(::getpid(), signal_self);
    return exit_code;
  }
  if (!until_file.empty()) {
    for (int waited = 0; waited < 1800 && !exists(until_file); ++waited) sleep_s(0.1);
  }
  if (sleep < 0) sleep_forever();
  if (sleep > 0) sleep_s(sleep);
  return 0;
}
