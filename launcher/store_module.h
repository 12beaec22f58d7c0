// Where ddprun's store rendezvous comes from: the multi-node rendezvous runs
// on c10d's TCPStore, which lives in LibTorch, so it is built as a module of
// its own (ddprun-store.so) that ddprun loads only for a rendezvous on a
// store (several nodes, or --rdzv-backend c10d). ddprun itself links no
// LibTorch: a one-node run starts without loading its hundreds of libraries
// (0.26 to 0.48 s of CPU a start with Debian's).
#pragma once

#include <memory>

#include "store_rendezvous.h"

namespace ddprun {

// The module's one entry point, with C linkage so dlsym finds it by name.
// It checks `abi` (DDPRUN_STORE_ABI of the ddprun that loads it) and returns
// null when they differ.
using StoreRendezvousEntry = Rendezvous* (*)(const char* abi, StoreConfig* config, const Tick* tick);
inline constexpr const char* kStoreModuleEntry = "ddprun_store_rendezvous";

// The store rendezvous: linked in (the launcher's unit tests link the
// module's code) or loaded from ddprun-store.so beside ddprun, or where it
// is installed (lib/ddprun/). Throws LaunchError naming the places looked
// in when the module is missing, cannot load, or comes from another build.
std::unique_ptr<Rendezvous> load_store_rendezvous(StoreConfig config, const Tick& tick);

}  // namespace ddprun
