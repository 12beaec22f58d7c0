// ddp::dist: torch.distributed's functional API in C++, for code ported
// from a torchrun script. The same names, arguments and rules:
//
//   dist.all_reduce(t, op=dist.ReduceOp.MAX)   ->  dist::all_reduce(t, dist::ReduceOp::MAX);
//   w = dist.all_reduce(t, async_op=True)      ->  auto w = dist::all_reduce(t, dist::async_op);
//   w.wait()                                   ->  w.wait();
//   g = dist.new_group([0, 2])                 ->  auto g = dist::new_group({0, 2});
//   dist.broadcast(t, src=2, group=g)          ->  dist::broadcast(t, 2, g);
//
// Blocking by default: a call returns when its collective has finished on
// this rank. With dist::async_op it returns a [[nodiscard]] ddp::Work to
// wait on (dropping it unwaited is a compiler warning, and the tensor's
// contents are then undefined, as in PyTorch). There is no `bool async_op`:
// `true` in its place does not compile.
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
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::dist {

using ddp::ReduceOp;
using ddp::Work;
using ddp::destroy_process_group;
using ddp::init_process_group;
using ddp::is_initialized;

// The tag that asks for the handle instead of waiting: async_op=True.
struct AsyncOp {
  explicit constexpr AsyncOp() = default;
};
inline constexpr AsyncOp async_op{};

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

// Collective over the default group: every rank calls it with the same
// `ranks` (global; any order, duplicates refused; empty = every rank) in the
// same order as its other new_group calls. Same backend as the default group.
Group new_group(std::vector<int> ranks = {}, std::optional<std::chrono::milliseconds> timeout = std::nullopt);

void barrier(const Group& group = {});
[[nodiscard]] Work barrier(const Group& group, AsyncOp);
[[nodiscard]] Work barrier(AsyncOp);

// ---- collectives (tensors are handles: results are written in place) ---------

void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM, const Group& group = {});
[[nodiscard]] Work all_reduce(const at::Tensor& tensor, ReduceOp op, const Group& group, AsyncOp);
[[nodiscard]] Work all_reduce(const at::Tensor& tensor, ReduceOp op, AsyncOp);
[[nodiscard]] Work all_reduce(const at::Tensor& tensor, AsyncOp);

// The result on `dst` only; the others' tensors are scratch (as in PyTorch).
void reduce(const at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM, const Group& group = {});
[[nodiscard]] Work reduce(const at::Tensor& tensor, int dst, ReduceOp op, const Group& group, AsyncOp);
[[nodiscard]] Work reduce(const at::Tensor& tensor, int dst, ReduceOp op, AsyncOp);
[[nodiscard]] Work reduce(const at::Tensor& tensor, int dst, AsyncOp);

void broadcast(const at::Tensor& tensor, int src, const Group& group = {});
[[nodiscard]] Work broadcast(const at::Tensor& tensor, int src, const Group& group, AsyncOp);
[[nodiscard]] Work broadcast(const at::Tensor& tensor, int src, AsyncOp);

// tensor_list: one tensor per rank of the group, written with each rank's `tensor`.
void all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group = {});
[[nodiscard]] Work all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                              const Group& group, AsyncOp);
[[nodiscard]] Work all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, AsyncOp);

// output: the ranks' inputs one after another along dim 0 (world size x input).
void all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const Group& group = {});
[[nodiscard]] Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const Group& group,
                                          AsyncOp);
[[nodiscard]] Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, AsyncOp);

// gather_list: on `dst` one tensor per rank; empty on every other rank.
void gather(const at::Tensor& tensor, const std::vector<at::Tensor>& gather_list = {}, int dst = 0,
            const Group& group = {});
[[nodiscard]] Work gather(const at::Tensor& tensor, const std::vector<at::Tensor>& gather_list, int dst,
                          const Group& group, AsyncOp);
[[nodiscard]] Work gather(const at::Tensor& tensor, const std::vector<at::Tensor>& gather_list, int dst, AsyncOp);

// scatter_list: on `src` one tensor per rank; empty on every other rank.
void scatter(const at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list = {}, int src = 0,
             const Group& group = {});
[[nodiscard]] Work scatter(const at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src,
                           const Group& group, AsyncOp);
[[nodiscard]] Work scatter(const at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src, AsyncOp);

// output = the reduction over ranks of their input_list[this rank].
void reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op = ReduceOp::SUM,
                    const Group& group = {});
[[nodiscard]] Work reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op,
                                  const Group& group, AsyncOp);
[[nodiscard]] Work reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list, AsyncOp);

// input: world size x output along dim 0; output = the reduction of this rank's chunk.
void reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM,
                           const Group& group = {});
[[nodiscard]] Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                         const Group& group, AsyncOp);
[[nodiscard]] Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, AsyncOp);

// input_list[r] goes to rank r, whose output_list[this rank] receives it.
void all_to_all(const std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                const Group& group = {});
[[nodiscard]] Work all_to_all(const std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                              const Group& group, AsyncOp);
[[nodiscard]] Work all_to_all(const std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                              AsyncOp);

// input split along dim 0 by input_split_sizes (empty: evenly), rank r's
// part to rank r; output receives the parts in rank order, split by
// output_split_sizes (empty: evenly).
void all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {}, const Group& group = {});
[[nodiscard]] Work all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                                     const std::vector<int64_t>& output_split_sizes,
                                     const std::vector<int64_t>& input_split_sizes, const Group& group, AsyncOp);
[[nodiscard]] Work all_to_all_single(const at::Tensor& output, const at::Tensor& input, AsyncOp);

}  // namespace ddp::dist
