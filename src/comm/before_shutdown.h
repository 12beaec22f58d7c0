// Work that must run on a process group before it shuts down: collectives
// of the group's holders (DDP gathers its timeline), run by
// destroy_process_group() and by the shutdown at exit while every rank still
// has the group, in the order registered. Private to the core.
#pragma once

#include <functional>
#include <memory>

#include "ddp/comm/process_group.h"

namespace ddp::detail {

// `fn` runs once, before `group` shuts down (if it does while `fn` is
// registered); it must not throw. Entries of groups gone are dropped.
void before_shutdown(const std::shared_ptr<ProcessGroup>& group, std::function<void()> fn);

// Runs and forgets what was registered for `group`.
void run_before_shutdown(const ProcessGroup& group);

}  // namespace ddp::detail
