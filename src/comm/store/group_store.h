// The rendezvous store a process group is made on: rank 0 serves it at
// MASTER_ADDR:MASTER_PORT (on that address alone, store_bind.h), the other
// ranks join it, each refuses a store of another job; and the group's view of
// it under a prefix of its own. Errors name which of MASTER_ADDR, MASTER_PORT
// or the machine is wrong. Private to the core.
#pragma once

#include <chrono>
#include <string>

#include "comm/c10d_compat.h"
#include "ddp/runtime/launch_env.h"

namespace ddp::detail {

struct GroupStore {
  c10::intrusive_ptr<c10d::Store> store;     // the job's store
  std::string prefix;                        // the group's keys: the job's id and a generation
  c10::intrusive_ptr<c10d::Store> prefixed;  // `store` under `prefix`, what the backend uses
};

// The job's store (served on rank 0, joined elsewhere), checked to be this
// job's, under the prefix of `generation`. `who` starts every error.
GroupStore group_store(const LaunchEnv& env, std::chrono::milliseconds timeout, int generation,
                       const std::string& who);

// `store` under the prefix of `generation` (GroupRegistry::next_generation).
// Under the agent store (TORCHELASTIC_USE_AGENT_STORE=True), the prefix
// begins with the launch round's (recovery_keys.h).
GroupStore prefixed_store(c10::intrusive_ptr<c10d::Store> store, const LaunchEnv& env, int generation);

// Whether MASTER_ADDR:MASTER_PORT is the launcher's store, which rank 0
// joins instead of serving (torchrun's TORCHELASTIC_USE_AGENT_STORE=True).
bool agent_store_in_use();

}  // namespace ddp::detail
