#include "comm/store/group_store.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "comm/recovery/recovery_keys.h"
#include "comm/store/store_bind.h"
#include "comm/store/store_client.h"
#include "ddp/errors.h"

namespace ddp::detail {

namespace {

// Rank 0 writes its job's id into the store it serves; every other rank
// reads it and refuses a store of another job (two jobs on one node that
// chose the same port), at once instead of training with strangers.
void check_same_job(c10d::Store& store, const LaunchEnv& env, const std::string& who,
                    std::chrono::milliseconds timeout) {
  const std::string key = "ddp_job_id";
  if (env.rank == 0) {
    store.set(key, std::vector<uint8_t>(env.job_id.begin(), env.job_id.end()));
    return;
  }
  std::vector<uint8_t> theirs;
  try {
    store.wait({key}, timeout);
    theirs = store.get(key);
  } catch (const std::exception& e) {
    throw CommError(who + "rank 0 of this job never said which job it is (" + e.what() + ")");
  }
  const std::string owner(theirs.begin(), theirs.end());
  if (owner != env.job_id)
    throw CommError(who + "the rendezvous store at " + env.master_addr + ":" + std::to_string(env.master_port) +
                    " belongs to job " + owner + ", not to this job (" + env.job_id +
                    "): two jobs chose the same MASTER_ADDR and MASTER_PORT. Give each job its own MASTER_PORT, "
                    "or leave it unset so that it comes from the job id");
}

std::string this_host() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

// Rank 0 serves the store on MASTER_ADDR's address (store_bind.h), and says
// which of MASTER_ADDR, MASTER_PORT or the machine is wrong when it cannot.
c10::intrusive_ptr<c10d::Store> serve_store(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                            const std::string& who) {
  const std::string at = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    auto served = store_bind::serve_tcp_store(
        env.master_addr, compat::tcp_store_options(env.master_port, true, env.world_size, timeout));
    if (!served.notice.empty()) std::cerr << who << "MASTER_ADDR " << served.notice << std::endl;
    return served.store;
  } catch (const store_bind::ListenError& e) {
    using Kind = store_bind::ListenError::Kind;
    switch (e.kind()) {
      case Kind::Unresolved:
        throw CommError(who + "cannot serve the rendezvous store: MASTER_ADDR " + e.what() +
                        "; set MASTER_ADDR to rank 0's host name or IP address, as every rank can resolve it");
      case Kind::NotLocal:
        throw CommError(who + "cannot serve the rendezvous store: MASTER_ADDR " + e.what() +
                        "; rank 0 serves the store, so MASTER_ADDR must be an address of rank 0's host (this is " +
                        "host " + this_host() + ")");
      case Kind::InUse:
        throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what() +
                        "; choose another MASTER_PORT, or stop the process that holds it");
      case Kind::Other: break;
    }
    throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what());
  } catch (const std::exception& e) {
    throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what());
  }
}

c10::intrusive_ptr<c10d::Store> join_store(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                           const std::string& who) {
  try {
    return store_client::connect_bounded(env.master_addr,
                                         compat::tcp_store_options(env.master_port, false, env.world_size, timeout));
  } catch (const std::exception& e) {
    throw CommError(who + "could not reach the rendezvous store at " + env.master_addr + ":" +
                    std::to_string(env.master_port) + ": " + e.what() +
                    "\n  (is rank 0 running, and is MASTER_ADDR reachable from this host?)");
  }
}

}  // namespace

// torchrun's TORCHELASTIC_USE_AGENT_STORE=True: MASTER_ADDR:MASTER_PORT is
// the launcher's own store (ddprun --recover-in-process), which every rank
// joins, rank 0 too; each launch round's keys under a prefix of its own.
bool agent_store_in_use() {
  const char* v = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return v && (std::string(v) == "True" || std::string(v) == "true" || std::string(v) == "1");
}

namespace {

std::string attempt_prefix() {
  if (!agent_store_in_use()) return "";
  for (const char* name : {"DDPRUN_RDZV_ROUND", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* v = std::getenv(name); v && *v) return recovery_keys::attempt_root(std::atoi(v));
  return recovery_keys::attempt_root(0);
}

}  // namespace

GroupStore prefixed_store(c10::intrusive_ptr<c10d::Store> store, const LaunchEnv& env, int generation) {
  GroupStore out;
  out.store = std::move(store);
  out.prefix = attempt_prefix() + "ddp_pg_" + (env.job_id.empty() ? std::string() : env.job_id + "_") +
               std::to_string(generation);
  out.prefixed = c10::make_intrusive<c10d::PrefixStore>(out.prefix, out.store);
  return out;
}

GroupStore group_store(const LaunchEnv& env, std::chrono::milliseconds timeout, int generation,
                       const std::string& who) {
  const bool serve = env.rank == 0 && !agent_store_in_use();
  auto store = serve ? serve_store(env, timeout, who) : join_store(env, timeout, who);
  if (!env.job_id.empty() && !agent_store_in_use()) check_same_job(*store, env, who, timeout);
  return prefixed_store(std::move(store), env, generation);
}

}  // namespace ddp::detail
