// Joining the job: ddp::init_process_group() creates the rendezvous store and
// a c10d backend (Gloo on CPUs, NCCL on GPUs) and returns a ProcessGroup, the
// narrow collective interface the rest of libddp talks to.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/errors.h"
#include "ddp/runtime/launch_env.h"

namespace ddp {

namespace detail {
struct WorkHandle;  // the backend's handle (src/comm/work_handle.h)
}  // namespace detail

// Handle to an asynchronous collective, as c10d's Work. wait() honours the
// process group's timeout and throws CommError naming rank and operation.
// The calls that start a collective and return its Work unwaited are
// [[nodiscard]]: a collective whose handle is dropped has not finished (its
// tensor holds whatever the backend has written so far). Copies share the
// collective. Default-constructed: nothing to wait for.
class Work {
 public:
  Work() = default;
  // Made by the backends (src/comm/work_handle.h).
  explicit Work(std::shared_ptr<detail::WorkHandle> handle) : handle_(std::move(handle)) {}

  void wait();
  // torch.distributed's work.wait(timeout): as wait(), but gives up after
  // `timeout` (a CommError naming the operation; the operation itself is
  // not cancelled and the group's timeout still bounds it).
  void wait(std::chrono::milliseconds timeout);
  // torch.distributed's work.is_completed(): whether it has ended (a failed
  // one too); true for a default-constructed Work.
  bool is_completed() const;
  bool valid() const { return static_cast<bool>(handle_); }
  // Runs `fn` on the backend's thread the moment the collective ends (at
  // once if it has), where the backend can tell (Gloo, NCCL); false where it
  // cannot (then the end is known only to wait()).
  bool on_complete(std::function<void()> fn);
  // The collective's future, as torch.distributed's work.get_future():
  // completed with its output tensors (a list) when it ends, or with its
  // error. Gloo and NCCL have one; a backend without (mpi, an empty Work) is
  // a UsageError naming it: wait() on the Work there.
  c10::intrusive_ptr<c10::ivalue::Future> get_future() const;
  // "gloo allreduce", ...; empty for a default-constructed Work.
  const std::string& op() const;
  // A receive's sender, as torch.distributed's work._source_rank() and c10d's
  // sourceRank(): its rank in the group, the src given to dist::irecv, or
  // for a receive from any rank the rank it came from (after wait()). Any
  // other Work is a UsageError, as c10d's.
  int source_rank() const;

 private:
  std::shared_ptr<detail::WorkHandle> handle_;
};

// The rendezvous store a group was made with, opaque: what a group that
// wraps another passes on from its store().
class StoreHandle;

// torch.distributed.ReduceOp. AVG: NCCL only, as in PyTorch (Gloo and MPI
// refuse it); BAND, BOR, BXOR: integer tensors. PREMUL_SUM: NCCL only, and
// only with its factor (dist::make_nccl_premul_sum, ddp/comm/dist.h).
enum class ReduceOp { SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM };
// "SUM", "AVG", ... as PyTorch spells them.
const char* reduce_op_name(ReduceOp op);

// One collective of ddp::dist (ddp/comm/dist.h) as a group's ranks see it:
// `root` is a rank of this group. Tensors are handles: outputs are written
// in place.
struct CollectiveCall {
  enum class Kind {
    AllReduce,            // inputs[0] in place, by `op`
    Reduce,               // inputs[0] in place on `root`, by `op`
    Broadcast,            // inputs[0] in place, from `root`
    AllGather,            // inputs[0] -> outputs (one per rank)
    AllGatherIntoTensor,  // inputs[0] -> outputs[0] (ranks' tensors along dim 0)
    Gather,               // inputs[0] -> outputs on `root` (one per rank; none elsewhere)
    Scatter,              // inputs on `root` (one per rank; none elsewhere) -> outputs[0]
    ReduceScatter,        // inputs (one per rank) -> outputs[0], by `op`
    ReduceScatterTensor,  // inputs[0] (ranks' chunks along dim 0) -> outputs[0], by `op`
    AllToAll,             // inputs[r] goes to rank r's outputs[this rank]
    AllToAllSingle,       // inputs[0] split along dim 0 by input_split_sizes (even when empty)
    Barrier,
    MonitoredBarrier,     // Gloo's: names the ranks that did not come within `timeout`
    Send,                 // inputs[0] to rank `root`, matched by `tag`
    Recv,                 // outputs[0] from rank `root` (-1: from any rank), matched by `tag`
  };
  Kind kind = Kind::Barrier;
  ReduceOp op = ReduceOp::SUM;
  double premul_factor = 1.0;  // PREMUL_SUM's: each rank's tensor times it, then summed
  int root = 0;
  int tag = 0;                             // Send, Recv
  std::chrono::milliseconds timeout{0};    // MonitoredBarrier's (0: the group's)
  bool wait_all_ranks = false;             // MonitoredBarrier: name every rank missing, not the first
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
  std::vector<int64_t> output_split_sizes, input_split_sizes;
};
// "all_reduce", "all_gather_into_tensor", ...: torch.distributed's names.
const char* collective_name(CollectiveCall::Kind kind);

// The collectives libddp needs. Gloo, NCCL and MPI sit behind it; tests wrap
// it to count what the reducer asked for.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;
  // Where this rank's tensors live: cuda:LOCAL_RANK under NCCL, else CPU.
  virtual torch::Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // In place, summed over ranks.
  [[nodiscard]] virtual Work allreduce(at::Tensor& tensor) = 0;
  [[nodiscard]] virtual Work broadcast(at::Tensor& tensor, int root) = 0;
  // Blocking: every rank's tensor (same shape on all ranks), in rank order.
  virtual std::vector<at::Tensor> allgather(const at::Tensor& tensor) = 0;
  virtual void barrier() = 0;
  // The rendezvous store the group was made with, for notes that must not
  // wait for a collective (the stall inspector); null where there is none.
  virtual std::shared_ptr<StoreHandle> store() const { return {}; }

  // Any collective of ddp::dist, started; what the backend lacks is a
  // UsageError naming the rank. The default refuses every one (a group of
  // one's own, e.g. a test's decorator, need not have them).
  [[nodiscard]] virtual Work collective(const CollectiveCall& call);
  // batch_isend_irecv's sends and receives, started together: NCCL's as one
  // group (ncclGroupStart/End); the default starts each with collective().
  [[nodiscard]] virtual std::vector<Work> coalesced(const std::vector<CollectiveCall>& calls);
  // ddp::dist::new_group: every rank of this group calls it, in the same
  // order; `ranks` (of this group, ascending, distinct) form the new group,
  // which this rank gets if it is one of them, else null. The default
  // refuses.
  virtual std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks,
                                                     std::chrono::milliseconds timeout);
  // Shuts the backend down now, with the subgroups it made, whoever else
  // still holds the group: its later calls are a UsageError, as PyTorch's on
  // a destroyed group. destroy_process_group() calls it; so does the
  // program's exit for a group still up (before the CUDA runtime unloads).
  // The default does nothing (a group of one's own, e.g. a test's).
  virtual void shutdown() {}
  // Ends the collectives in flight with an error now, from any thread, and
  // leaves the group unusable: NCCL's communicator abort (LibTorch 2.x), as
  // PyTorch's ProcessGroup.abort(). LibTorch's Gloo has none (a recoverable
  // group shuts its connections down instead); the default does nothing.
  virtual void abort() {}
};

struct ProcessGroupOptions {
  // "auto" (NCCL when this worker has a GPU, else Gloo), "gloo", "nccl" or
  // "mpi" (Open MPI, in builds where CMake found it; the process must be
  // started by mpirun). Anything else is a UsageError here; an mpi group in
  // a build or process without MPI is one in init_process_group.
  ProcessGroupOptions& backend(std::string name);
  const std::string& backend() const { return backend_; }
  // Every blocking call (store, collectives, barrier) honours it; > 0.
  // PyTorch's default, 30 minutes.
  ProcessGroupOptions& timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }
  // "env://" (the launch environment), or "tcp://HOST:PORT" to override the
  // master. Anything else is a UsageError here.
  ProcessGroupOptions& init_method(std::string method);
  const std::string& init_method() const { return init_method_; }

 private:
  std::string backend_ = "auto";
  std::chrono::milliseconds timeout_ = std::chrono::minutes(30);
  std::string init_method_ = "env://";
};

// Joins the job described by the environment (see LaunchEnv) and makes the
// result the default group. Throws LaunchEnvError/CommError with the rank.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env, const ProcessGroupOptions& options);

// The group made by init_process_group; throws if there is none.
std::shared_ptr<ProcessGroup> default_process_group();
bool is_initialized();

// As torch.distributed.destroy_process_group(): shuts the default group's
// backend down (ProcessGroup::shutdown, NCCL's normal exit) and drops it;
// DDP and others that still hold it get a UsageError from its later calls.
// A program that returns from main without calling it is fine: groups still
// up are shut down at exit, before the CUDA runtime unloads.
void destroy_process_group();

// The MPI library the mpi backend is built on, as MPI_Get_library_version
// names it ("Open MPI v4.1.4": its first line up to a comma), or "" in a
// build without MPI. Needs no MPI_Init.
std::string mpi_library_version();

// "rank 3/4" for messages.
std::string rank_tag(const ProcessGroup& pg);

}  // namespace ddp
