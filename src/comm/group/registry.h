// The process's groups, as one object: the default group and the launch
// environment it came from, the job's groups on other backends beside it
// (dist::new_group(ranks, timeout, backend): a gloo group beside an nccl one,
// PyTorch's common pattern for CPU-side metadata), every group made here
// (shut down at exit if still up), the store prefixes' generation, and the
// work that must run on a group before it shuts down (DDP gathers its
// timeline). One mutex guards it all; no group's work runs under it.
// Private to the core.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/runtime/launch_env.h"

namespace ddp::detail {

class GroupRegistry {
 public:
  // The one registry of this process; never destroyed, so the shutdown at
  // exit finds it whatever order static objects go in.
  static GroupRegistry& instance();

  // Makes `group` the default group, made from `env` (init_process_group's,
  // with its init_method applied), and shuts it down at exit if still up then.
  std::shared_ptr<ProcessGroup> adopt_default(std::shared_ptr<ProcessGroup> group, const LaunchEnv& env);
  std::shared_ptr<ProcessGroup> default_group() const;  // null before init_process_group
  LaunchEnv launch_env() const;                         // the default group's

  // The job's group on `backend` beside the default one, made by `make` on
  // the first call (collective: every rank calls it in the same order).
  std::shared_ptr<ProcessGroup> beside(const std::string& backend,
                                       const std::function<std::shared_ptr<ProcessGroup>()>& make);

  // A number for a fresh store prefix, the same on every rank (each makes its
  // groups in the same order).
  int next_generation();

  // Shuts the default group and those beside it down (destroy_process_group).
  void destroy();

  // `fn` runs once, before `group` shuts down (if it does while `fn` is
  // registered); it must not throw. Entries of groups gone are dropped.
  void before_shutdown(const std::shared_ptr<ProcessGroup>& group, std::function<void()> fn);
  // Runs and forgets what was registered for `group`.
  void run_before_shutdown(const ProcessGroup& group);

 private:
  GroupRegistry() = default;
  static void shut_down_at_exit();

  struct Pending {
    std::weak_ptr<ProcessGroup> group;
    std::function<void()> fn;
  };
  mutable std::mutex mutex_;
  std::shared_ptr<ProcessGroup> default_;
  LaunchEnv launch_env_;
  std::map<std::string, std::shared_ptr<ProcessGroup>> beside_;  // by backend
  std::vector<std::weak_ptr<ProcessGroup>> made_;                // every group made here, oldest first
  int generation_ = 0;
  std::vector<Pending> before_shutdown_;
};

// The job's group on `backend` ("gloo", "nccl" or "mpi", not the default
// group's) beside the default group: made on the first call, by every rank of
// the job in the same order as its other new_group calls, then reused.
std::shared_ptr<ProcessGroup> job_group_of_backend(const std::string& backend, std::chrono::milliseconds timeout);

}  // namespace ddp::detail
