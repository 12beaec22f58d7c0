// The keys in-process recovery keeps in the launcher's store, shared by the
// workers (recoverable_group.cpp) and ddprun, which reports a worker it lost
// (docs/launcher.md lists them). Each launch round has its own root, as
// torchrun's agent store gives each attempt a prefix of its own.
#pragma once

#include <string>

namespace ddp::recovery_keys {

// The workers' prefix on the agent's store in launch round `round`
// (torchrun's "/worker/attempt_N").
inline std::string attempt_root(int round) { return "/worker/attempt_" + std::to_string(round) + "/"; }

// Under attempt_root: in-process recovery's own keys.
inline std::string root(int round) { return attempt_root(round) + "ddp_recovery/"; }
// A counter every fault adds one to: a rank that saw its group fail, ddprun
// for a worker it lost. The workers watch it.
inline std::string faults(int round) { return root(round) + "faults"; }
// Set by ddprun when the worker of launch rank `slot` ended: the survivors do
// not wait for it when they re-form.
inline std::string lost(int round, int slot) { return root(round) + "lost/" + std::to_string(slot); }

}  // namespace ddp::recovery_keys
