// ddp::dist: torch.distributed's functional API in C++, for code ported
// from a torchrun script. The same names, arguments and rules:
//
//   dist.all_reduce(t, op=dist.ReduceOp.MAX)   ->  dist::all_reduce(t, dist::ReduceOp::MAX);
//   w = dist.all_reduce(t, async_op=True)      ->  auto w = dist::all_reduce(t, dist::ReduceOp::SUM, {}, true);
//   w.wait()                                   ->  w.wait();
//   g = dist.new_group([0, 2])                 ->  auto g = dist::new_group({0, 2});
//   dist.broadcast(t, src=2, group=g)          ->  dist::broadcast(t, 2, g);
//   dist.send(t, dst=1); dist.recv(t)          ->  dist::send(t, 1); int from = dist::recv(t);
//   dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1)])
//                                              ->  dist::batch_isend_irecv({dist::P2POp(dist::isend, t, 1)});
//   g = dist.new_group(backend="gloo")         ->  auto g = dist::new_group({}, std::nullopt, "gloo");
//
// One function per operation, with PyTorch's arguments in PyTorch's order
// and with its defaults. Blocking by default: a call returns when its
// collective has finished on this rank. With async_op true it returns the
// started collective's ddp::Work to wait on (a tensor's contents are
// undefined until then, as in PyTorch).
//
// The group: omitted (or dist::Group{}), the default group that
// ddp::init_process_group made (group=None); src, dst and the ranks of
// new_group are global ranks, as in PyTorch. A rank outside a group gets
// -1 from get_rank/get_world_size, and a collective on that group does
// nothing there (PyTorch warns and returns None; so do we, once per op).
//
// What each backend has (PyTorch's, for Gloo and NCCL: these call c10d's
// own; our MPI backend has them all) is in docs/api.md. What a backend lacks
// is a UsageError naming the rank and the op, raised before anything starts.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::dist {

using ddp::ReduceOp;
using ddp::Work;
using ddp::destroy_process_group;
using ddp::init_process_group;
using ddp::is_initialized;

// A process group as torch.distributed's functions take it: the default
// group, a group of one's own, or what new_group returned (which knows the
// global ranks of its members).
class Group {
 public:
  Group() = default;  // the default group
  // A whole group, whose ranks are the global ranks (one made by
  // ddp::init_process_group), or the process group of a group new_group
  // made (which is known by its members' global ranks). Null is the default
  // group.
  Group(std::shared_ptr<ProcessGroup> pg);  // NOLINT(google-explicit-constructor): as `group=pg`

  // new_group's result: `ranks` are the members' global ranks, ascending;
  // `pg` is null on a rank that is not one of them.
  static Group of_ranks(std::shared_ptr<ProcessGroup> pg, std::vector<int> ranks);

  bool is_default() const { return !pg_ && !subgroup_; }
  // Whether this rank belongs to the group (always, for the default group).
  bool is_member() const { return is_default() || pg_ != nullptr; }
  // The group to run collectives on; null where this rank is not a member.
  std::shared_ptr<ProcessGroup> process_group() const;
  // The members' global ranks, ascending (every rank, for a whole group).
  std::vector<int> ranks() const;

 private:
  std::shared_ptr<ProcessGroup> pg_;
  bool subgroup_ = false;
  std::vector<int> ranks_;  // for a subgroup
};

// torch.distributed.group.WORLD: the default group.
namespace group {
inline const Group WORLD{};
}  // namespace group

// ---- what this build and launch have -----------------------------------------

// torch.distributed.is_available(): true (libddp is its distributed part).
bool is_available();
// Whether this build of libddp has the backend (Gloo always; NCCL with a
// CUDA LibTorch; mpi where CMake found MPI), as PyTorch's is_*_available().
bool is_gloo_available();
bool is_nccl_available();
bool is_mpi_available();
// Whether this process was started by ddprun or torchrun
// (TORCHELASTIC_RUN_ID is set), as torch.distributed.is_torchelastic_launched().
bool is_torchelastic_launched();

// ---- the group ----------------------------------------------------------------

// This process's rank in `group` (-1 where it is not a member).
int get_rank(const Group& group = {});
// The number of ranks in `group` (-1 where this rank is not a member).
int get_world_size(const Group& group = {});
// "gloo", "nccl" or "mpi".
std::string get_backend(const Group& group = {});
// A global rank's rank in `group`, and back; a rank outside it is a UsageError.
int get_group_rank(const Group& group, int global_rank);
int get_global_rank(const Group& group, int group_rank);
// The group's members' global ranks, ascending, as get_process_group_ranks.
std::vector<int> get_process_group_ranks(const Group& group);

// Collective over the default group: every rank calls it with the same
// `ranks` (global; any order, duplicates refused; empty = every rank) in the
// same order as its other new_group calls. `backend`: "" for the default
// group's; "gloo" (or "nccl", or "mpi" under mpirun where built) for a group
// of another kind beside it, as PyTorch's common CPU group for metadata next
// to NCCL. The first group of another kind connects every rank of the job
// once (over the default group's store, or a store rank 0 serves at
// MASTER_ADDR:MASTER_PORT when the default group is mpi's).
Group new_group(std::vector<int> ranks = {}, std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                std::string backend = "");
// new_group([0, 2], backend="gloo") -> dist::new_group({0, 2}, "gloo").
inline Group new_group(std::vector<int> ranks, std::string backend) {
  return new_group(std::move(ranks), std::nullopt, std::move(backend));
}
// Ranks of another integer type (int64_t, size_t: a tensor's or a loop's).
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, int>>>
Group new_group(const std::vector<Int>& ranks, std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                std::string backend = "") {
  return new_group(std::vector<int>(ranks.begin(), ranks.end()), timeout, std::move(backend));
}

// torch.distributed.new_subgroups (PyTorch 2.x's): `group`'s global ranks,
// ascending, cut into consecutive subgroups of `group_size`, each made by
// new_group in turn, so every rank of the job calls it, as new_group.
// Returns this rank's subgroup (one it is not a member of, where it is
// outside `group`) and all of them, in order. group_size omitted: the ranks
// on this node, the launch environment's LOCAL_WORLD_SIZE (PyTorch counts
// the node's GPUs, torch.cuda.device_count(), and needs CUDA for it); every
// node must run as many. A group_size that is not positive, exceeds the
// group's size or does not divide it is a UsageError, before any group is made.
//   cur, all = dist.new_subgroups(group_size=2)  ->  auto [cur, all] = dist::new_subgroups(2);
std::pair<Group, std::vector<Group>> new_subgroups(std::optional<int> group_size = std::nullopt,
                                                   const Group& group = {},
                                                   std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                                                   std::string backend = "");

// Waits for every rank of `group` (async_op: as the collectives below).
Work barrier(const Group& group = {}, bool async_op = false);

// Gloo only, as PyTorch's: a barrier that, when some rank does not arrive
// within `timeout` (omitted: the group's), fails on rank 0 with a CommError
// naming it (every rank missing with wait_all_ranks), and on the others.
void monitored_barrier(const Group& group = {}, std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                       bool wait_all_ranks = false);
// monitored_barrier(timeout=timedelta(seconds=30)) -> dist::monitored_barrier(30s).
inline void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = false) {
  monitored_barrier(Group(), timeout, wait_all_ranks);
}

// ---- reductions ------------------------------------------------------------------

// torch.distributed's `op` argument: a ReduceOp (which converts to it), or
// PREMUL_SUM with its factor (NCCL only): make_nccl_premul_sum(f), as
// torch.distributed._make_nccl_premul_sum. ReduceOp::PREMUL_SUM by itself,
// without a factor, is a UsageError.
class Reduction {
 public:
  Reduction(ReduceOp op) : op_(op) {}  // NOLINT(google-explicit-constructor): as `op=ReduceOp.MAX`
  ReduceOp op() const { return op_; }
  double factor() const { return factor_; }
  bool has_factor() const { return has_factor_; }

 private:
  friend Reduction make_nccl_premul_sum(double factor);
  ReduceOp op_;
  double factor_ = 1.0;
  bool has_factor_ = false;
};
// Each rank's tensor multiplied by `factor`, then summed (NCCL only).
Reduction make_nccl_premul_sum(double factor);

// ---- collectives (tensors are handles: results are written in place) ---------
//
// Each returns a ddp::Work: with async_op false (the default) the call has
// waited for the collective on this rank, and the Work is an empty, finished
// one (PyTorch's None); with async_op true the collective is started and the
// Work is its handle to wait on. A rank outside `group` does nothing and
// gets an empty Work.

// output = the reduction over ranks of their `tensor`, in place.
Work all_reduce(const at::Tensor& tensor, Reduction op = ReduceOp::SUM, const Group& group = {},
                bool async_op = false);

// The result on `dst` only; the others' tensors are scratch (as in PyTorch).
Work reduce(const at::Tensor& tensor, int dst, Reduction op = ReduceOp::SUM, const Group& group = {},
            bool async_op = false);

Work broadcast(const at::Tensor& tensor, int src, const Group& group = {}, bool async_op = false);

// tensor_list: one tensor per rank of the group, written with each rank's `tensor`.
Work all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group = {},
                bool async_op = false);

// output: the ranks' inputs one after another along dim 0 (world size x input).
Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const Group& group = {},
                            bool async_op = false);

// gather_list: on `dst` one tensor per rank; empty on every other rank.
Work gather(const at::Tensor& tensor, const std::vector<at::Tensor>& gather_list = {}, int dst = 0,
            const Group& group = {}, bool async_op = false);

// scatter_list: on `src` one tensor per rank; empty on every other rank.
Work scatter(const at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list = {}, int src = 0,
             const Group& group = {}, bool async_op = false);

// output = the reduction over ranks of their input_list[this rank].
Work reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list,
                    Reduction op = ReduceOp::SUM, const Group& group = {}, bool async_op = false);

// input: world size x output along dim 0; output = the reduction of this rank's chunk.
Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, Reduction op = ReduceOp::SUM,
                           const Group& group = {}, bool async_op = false);

// input_list[r] goes to rank r, whose output_list[this rank] receives it.
Work all_to_all(const std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                const Group& group = {}, bool async_op = false);

// input split along dim 0 by input_split_sizes (empty: evenly), rank r's
// part to rank r; output receives the parts in rank order, split by
// output_split_sizes (empty: evenly).
Work all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {}, const Group& group = {},
                       bool async_op = false);

// ---- point to point ---------------------------------------------------------------

// `dst` and `src` are global ranks, as in PyTorch; `tag` matches a send with
// its receive (Gloo and MPI; NCCL ignores it). Complex tensors travel as
// their real view, as PyTorch 2.x's. Over NCCL, each rank of a pair needs a
// GPU of its own (docs/api.md).

// Returns once `tensor` has been handed over. Sending to this rank itself is
// a UsageError (it could never be received), as PyTorch 2.x's.
void send(const at::Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
// Fills `tensor` from `src`, or from whichever rank sends first when src is
// omitted (Gloo and MPI; NCCL cannot), and returns the sender's global rank
// (-1 where this rank is not in the group).
int recv(const at::Tensor& tensor, std::optional<int> src = std::nullopt, const Group& group = {}, int tag = 0);
// The same, started: wait on the Work. An irecv from any source names its
// sender in the Work's source_rank() (the group's rank) after wait().
[[nodiscard]] Work isend(const at::Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
[[nodiscard]] Work irecv(const at::Tensor& tensor, std::optional<int> src = std::nullopt, const Group& group = {},
                         int tag = 0);

// One send or receive of batch_isend_irecv, as torch.distributed.P2POp:
// `op` is dist::isend or dist::irecv (anything else does not compile, or
// is a UsageError for another function of the same type); `peer` a global
// rank.
class P2POp {
 public:
  using Isend = Work (*)(const at::Tensor&, int, const Group&, int);
  using Irecv = Work (*)(const at::Tensor&, std::optional<int>, const Group&, int);
  P2POp(Isend op, at::Tensor tensor, int peer, Group group = {}, int tag = 0);
  P2POp(Irecv op, at::Tensor tensor, int peer, Group group = {}, int tag = 0);

  bool is_send() const { return send_; }
  const at::Tensor& tensor() const { return tensor_; }
  int peer() const { return peer_; }
  const Group& group() const { return group_; }
  int tag() const { return tag_; }

 private:
  bool send_;
  at::Tensor tensor_;
  int peer_;
  Group group_;
  int tag_;
};

// Starts every op of the list (all on one group) and returns their Works,
// to wait on: NCCL's as one group of sends and receives, the other
// backends' one by one, as PyTorch's. An empty list, or ops on different
// groups, is a UsageError.
[[nodiscard]] std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& p2p_op_list);

}  // namespace ddp::dist
