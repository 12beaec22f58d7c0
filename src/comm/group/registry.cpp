#include "comm/group/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ddp::detail {

GroupRegistry& GroupRegistry::instance() {
  static auto* registry = new GroupRegistry;
  return *registry;
}

// At exit, every group still up is shut down, the newest first. The handler
// is registered once the first group's backend was made (and with it, under
// NCCL, the CUDA runtime initialized), so it runs before the runtime's own
// teardown and before static destructors: a program that returns from main
// without destroy_process_group() ends as cleanly as one that calls it.
void GroupRegistry::shut_down_at_exit() {
  auto& self = instance();
  std::vector<std::shared_ptr<ProcessGroup>> up;
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    for (auto& weak : self.made_)
      if (auto group = weak.lock()) up.push_back(std::move(group));
    self.made_.clear();
    self.default_.reset();
    self.beside_.clear();
  }
  for (auto it = up.rbegin(); it != up.rend(); ++it) {
    try {
      self.run_before_shutdown(**it);
      (*it)->shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "libddp: rank %d: shutting the %s process group down at exit: %s\n", (*it)->rank(),
                   (*it)->backend_name().c_str(), e.what());
    }
  }
}

std::shared_ptr<ProcessGroup> GroupRegistry::adopt_default(std::shared_ptr<ProcessGroup> group,
                                                           const LaunchEnv& env) {
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(shut_down_at_exit); });
  std::lock_guard<std::mutex> lock(mutex_);
  default_ = group;
  launch_env_ = env;
  made_.push_back(group);
  return group;
}

std::shared_ptr<ProcessGroup> GroupRegistry::default_group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return default_;
}

LaunchEnv GroupRegistry::launch_env() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return launch_env_;
}

std::shared_ptr<ProcessGroup> GroupRegistry::beside(const std::string& backend,
                                                    const std::function<std::shared_ptr<ProcessGroup>()>& make) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = beside_.find(backend);
    if (it != beside_.end()) return it->second;
  }
  auto made = make();  // collective: outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  beside_[backend] = made;
  made_.push_back(made);
  return made;
}

int GroupRegistry::next_generation() {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_++;
}

void GroupRegistry::destroy() {
  std::shared_ptr<ProcessGroup> last;
  std::map<std::string, std::shared_ptr<ProcessGroup>> beside;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last.swap(default_);
    beside.swap(beside_);
  }
  // Outside the lock: a backend's shutdown may block briefly.
  for (auto& [name, group] : beside) {
    run_before_shutdown(*group);
    group->shutdown();
  }
  if (!last) return;
  run_before_shutdown(*last);
  last->shutdown();
}

void GroupRegistry::before_shutdown(const std::shared_ptr<ProcessGroup>& group, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  before_shutdown_.erase(std::remove_if(before_shutdown_.begin(), before_shutdown_.end(),
                                        [](const Pending& p) { return p.group.expired(); }),
                         before_shutdown_.end());
  before_shutdown_.push_back({group, std::move(fn)});
}

void GroupRegistry::run_before_shutdown(const ProcessGroup& group) {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto mine = [&](const Pending& p) { return p.group.lock().get() == &group; };
    for (const auto& p : before_shutdown_)
      if (mine(p)) due.push_back(p.fn);
    before_shutdown_.erase(std::remove_if(before_shutdown_.begin(), before_shutdown_.end(), mine),
                           before_shutdown_.end());
  }
  for (auto& fn : due) fn();
}

}  // namespace ddp::detail
