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
// usual. Neither variable nor LD_PRELOAD reaches the ranks' own children.
// Should an initializer have started a thread (fork copies only the caller),
// each rank execs the program afresh instead.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace {

using Main = int (*)(int, char**, char**);
Main real_main = nullptr;

int thread_count() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.') ++count;
    ::closedir(dir);
  }
  return count;
}

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
      return real_main(argc, argv, environ);
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
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    write_file(folder + "/rank" + std::to_string(it->second) + ".exit", std::to_string(code));
    ranks.erase(it);
  }
  ::_exit(0);
}

}  // namespace

extern "C" int __libc_start_main(Main main, int argc, char** argv, void (*init)(), void (*fini)(),
                                 void (*rtld_fini)(), void* stack_end) {
  using Start = int (*)(Main, int, char**, void (*)(), void (*)(), void (*)(), void*);
  const auto real_start = reinterpret_cast<Start>(::dlsym(RTLD_NEXT, "__libc_start_main"));
  real_main = main;
  return real_start(fork_ranks, argc, argv, init, fini, rtld_fini, stack_end);
}
