// The rendezvous over a c10d::TCPStore (static and c10d flavours; see
// rendezvous.h), as make_rendezvous configures it: built into ddprun's
// store module (store_module.h), which holds all of the launcher's LibTorch.
#pragma once

#include <memory>
#include <string>

#include "rendezvous.h"

namespace ddprun {

struct StoreConfig {
  bool dynamic = false;     // c10d (join order) vs static (--node-rank)
  std::string host;         // store address
  int port = 0;
  bool host_store = false;  // try to serve the store here
  bool fall_back_to_client = false;  // c10d: another ddprun here may serve it already
  std::string run_id;
  int min_nodes = 1, max_nodes = 1;
  int node_rank = 0;        // static only
  std::string master_addr;  // static: the workers' MASTER_ADDR
  std::string local_addr;   // c10d: --local-addr
  std::string fingerprint;  // settings every node must share
  RdzvConf conf;
  // --recover-in-process: a node gone silent costs its workers, not the round.
  bool recover_in_process = false;
};

std::unique_ptr<Rendezvous> make_store_rendezvous(StoreConfig config, const Tick& tick);

}  // namespace ddprun
