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
// Set when the worker of launch rank `slot` is gone: by ddprun when its
// process ended, by the rank watching its heartbeat when that stopped. The
// survivors do not wait for it when they re-form.
inline std::string lost(int round, int slot) { return root(round) + "lost/" + std::to_string(slot); }
// Set by a worker started in place of a lost one until the others take it in.
inline std::string joining(int round, int slot) { return root(round) + "joining/" + std::to_string(slot); }
// One more after each lost/ key written: the workers watch it.
inline std::string lost_count(int round) { return root(round) + "lost_count"; }
// A rank's heartbeat, a counter it adds to.
inline std::string beat(int round, int slot) { return root(round) + "beat/" + std::to_string(slot); }
// Generation `g`'s keys: its members, their arrivals, its faults, its steps.
inline std::string generation(int round, int g) { return root(round) + "gen/" + std::to_string(g) + "/"; }
// A counter a rank adds to when its step failed in generation `g`.
inline std::string faults(int round, int g) { return generation(round, g) + "faults"; }

}  // namespace ddp::recovery_keys
