#include "comm/backend/comm_threads.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "ddp/errors.h"

namespace ddp::detail {

std::set<pid_t> thread_ids() {
  std::set<pid_t> ids;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return ids;  // no procfs: nothing is tuned
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long id = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && id > 0) ids.insert(static_cast<pid_t>(id));
  }
  closedir(dir);
  return ids;
}

std::set<pid_t> new_threads(const std::set<pid_t>& before, const std::set<pid_t>& after) {
  std::set<pid_t> added;
  for (pid_t id : after)
    if (!before.count(id)) added.insert(id);
  return added;
}

bool gloo_loop_idle_from_environment(int rank) {
  const char* value = std::getenv("DDP_GLOO_LOOP_POLICY");
  if (!value || !*value || std::strcmp(value, "normal") == 0) return false;
  if (std::strcmp(value, "idle") == 0) return true;
  throw UsageError("rank " + std::to_string(rank) + ": DDP_GLOO_LOOP_POLICY='" + value +
                   "' is not a policy; use normal (the default) or idle");
}

namespace {

std::string thread_name(pid_t tid) {
  std::string name;
  std::getline(std::ifstream("/proc/self/task/" + std::to_string(tid) + "/comm"), name);
  return name;
}

}  // namespace

void tune_comm_thread(pid_t tid, const std::string& name, bool idle, bool names_itself) {
  if (names_itself) {
    // Let a thread that names itself do so first (at most 500 ms), so that
    // its own name cannot overwrite ours.
    const std::string inherited = thread_name(static_cast<pid_t>(::getpid()));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (thread_name(tid) == inherited && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The kernel keeps 15 characters of a thread's name.
  std::ofstream("/proc/self/task/" + std::to_string(tid) + "/comm") << name.substr(0, 15);
  if (idle) {
    sched_param param{};
    sched_setscheduler(tid, SCHED_IDLE, &param);
  }
}

}  // namespace ddp::detail
