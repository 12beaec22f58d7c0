#include "cli_flags.h"

#include <boost/program_options/value_semantic.hpp>
#include <string>

namespace po = boost::program_options;

namespace ddprun {

const char* const kUsage = R"(Usage: ddprun [options] PROGRAM [ARGS...]
       ddprun [options] -- PROGRAM [ARGS...]

Starts PROGRAM once per worker with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_*), supervises the workers, and stops all of them when one fails.
Every flag also has torchrun's underscore spelling (--nproc_per_node) and an
environment default PET_<FLAG> (PET_NPROC_PER_NODE=4). Under Slurm, --nnodes,
--node-rank and --master-addr default from the step's SLURM_STEP_NUM_NODES,
SLURM_NODEID and the first host of SLURM_STEP_NODELIST (else the job's
SLURM_NNODES and SLURM_JOB_NODELIST).

Examples:
  ddprun --nproc-per-node gpu ./train --epochs 10        one worker per visible GPU
  ddprun --standalone --nproc-per-node 4 ./train         one node, free port on loopback
  ddprun --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 ./train
  ddprun --nnodes 1:4 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id job42 ./train
  srun --ntasks-per-node 1 ddprun --nproc-per-node gpu --master-port 29500 ./train
  ddprun --nproc-per-node 8 --log-dir logs --tee 3 --local-ranks-filter 0 ./train

Exit status: the first failing worker's exit code (128+N if it died by signal N),
2 for a command-line error, 1 for another launcher error, 128+N if ddprun itself
received signal N.
)";

po::options_description make_description() {
  po::options_description d("Options", 100, 50);
  auto str = [](const char* def) { return po::value<std::string>()->default_value(def); };
  // clang-format off
  d.add_options()
    ("help,h", "show this help and exit")
    ("version", "show ddprun's version and exit")
    ("nproc-per-node", str("1"), "workers on this node: N, auto (visible GPUs, else CPUs), gpu (visible GPUs), cpu (CPUs)")
    ("nnodes", str("1:1"), "number of nodes N, or MIN:MAX for c10d rendezvous")
    ("node-rank", str("0"), "this node's rank in [0, nnodes) (static rendezvous)")
    ("master-addr", str("127.0.0.1"), "host of node 0 (static rendezvous); IPv6 as [::1]")
    ("master-port", str("29500"), "port on node 0: single node, the workers' MASTER_PORT; several nodes, the rendezvous store")
    ("standalone", po::bool_switch(), "one node on loopback with a free port; ignores --rdzv-*, --master-*")
    ("rdzv-backend", str("static"), "static (fixed --nnodes, --node-rank) or c10d (TCPStore at --rdzv-endpoint, nodes ranked by join order)")
    ("rdzv-endpoint", str(""), "HOST[:PORT] of the c10d store (default port 29400); for static it replaces --master-addr/--master-port")
    ("rdzv-id", str("none"), "run id shared by every node (TORCHELASTIC_RUN_ID)")
    ("rdzv-conf", str(""), "KEY=VALUE,... : join_timeout (600 s), last_call_timeout (30 s), close_timeout (30 s), keep_alive_interval (5 s), keep_alive_max_attempt (3), is_host (auto)")
    ("local-addr", str(""), "address other nodes reach this node at, if it hosts the workers' master (c10d)")
    ("max-restarts", str("0"), "restart the whole worker group (every node) up to this many times after a failure")
    ("recover-in-process", po::bool_switch(), "a failed worker does not stop the others: they re-form without it in their processes (libddp's init_recoverable_group); ddprun serves their store")
    ("monitor-interval", str("0.1"), "seconds between checks of the other nodes' state (local exits are seen at once)")
    ("term-timeout", str("30"), "seconds between SIGTERM and SIGKILL when stopping workers (env DDPRUN_TERM_TIMEOUT)")
    ("role", str("default"), "worker role name (ROLE_NAME)")
    ("log-dir", str(""), "keep each worker's stdout and stderr in LOG_DIR/RUN_ID_XXXXXX/attempt_N/LOCAL_RANK/{stdout,stderr}.log")
    ("redirects,r", str("0"), "send streams to the log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank 0:1,1:2")
    ("tee,t", str("0"), "copy streams to the log files as well as the console (same syntax as --redirects)")
    ("local-ranks-filter", str(""), "show only these local ranks on the console, e.g. 0 or 0,2 (files keep everything)")
    ("no-python", po::bool_switch(), "run PROGRAM directly even if it ends in .py")
    ("module,m", po::bool_switch(), "PROGRAM is a Python module: run PYTHON -u -m PROGRAM (PYTHON_EXEC, else the first of python3, /usr/bin/python3, python that imports torch)")
    ("run-path", po::bool_switch(), "(torchrun only; rejected)")
    ("start-method", str("spawn"), "(accepted for torchrun compatibility; workers are always fork+exec'd)");
  // clang-format on
  return d;
}

}  // namespace ddprun
