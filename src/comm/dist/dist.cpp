#include "ddp/comm/dist.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "comm/backend/connect.h"
#include "comm/group/registry.h"
#include "comm/dist/dist_notes.h"

namespace ddp::detail {

std::string dist_who(const char* op) {
  return "rank " + std::to_string(ddp::is_initialized() ? default_process_group()->rank() : -1) + ": dist." + op +
         ": ";
}

void dist_warn_not_in_group(const char* op) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(op).second) return;
  TORCH_WARN("Running ", op, " on global rank ", default_process_group()->rank(),
             " which does not belong to the given group.");
}

int dist_root_of(const dist::Group& group, int global, const char* op, const char* what) {
  if (!group.is_member()) return -1;
  const auto ranks = group.ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global);
  if (it == ranks.end()) {
    std::string list;
    for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    throw UsageError(dist_who(op) + what + " " + std::to_string(global) +
                     " is not a rank of the group (its global ranks: " + list + ")");
  }
  return static_cast<int>(it - ranks.begin());
}

}  // namespace ddp::detail

namespace ddp::dist {

namespace {

using Kind = CollectiveCall::Kind;
using ddp::detail::dist_root_of;
using ddp::detail::dist_warn_not_in_group;
using ddp::detail::dist_who;

void check_tensor(const at::Tensor& t, const char* op, const char* what = "tensor") {
  if (!t.defined()) throw UsageError(dist_who(op) + "the " + what + " is undefined");
}

void check_list(const std::vector<at::Tensor>& list, const char* op, const char* what) {
  for (const auto& t : list)
    if (!t.defined()) throw UsageError(dist_who(op) + "a tensor of " + what + " is undefined");
}

// Starts `call` on `group`'s process group; waits unless `async`. A rank
// outside the group does nothing and gets an empty Work.
Work run(CollectiveCall call, const Group& group, bool async) {
  const auto pg = group.process_group();
  if (!pg) {
    dist_warn_not_in_group(collective_name(call.kind));
    return Work();
  }
  Work work = pg->collective(call);
  if (async) return work;
  work.wait();
  return Work();
}

CollectiveCall make(Kind kind, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs = {},
                    Reduction op = ReduceOp::SUM, int root = 0) {
  if (op.op() == ReduceOp::PREMUL_SUM && !op.has_factor())
    throw UsageError(dist_who(collective_name(kind)) +
                     "ReduceOp::PREMUL_SUM needs its factor: use dist::make_nccl_premul_sum(factor), as PyTorch's "
                     "torch.distributed._make_nccl_premul_sum");
  CollectiveCall call;
  call.kind = kind;
  call.inputs = std::move(inputs);
  call.outputs = std::move(outputs);
  call.op = op.op();
  call.premul_factor = op.factor();
  call.root = root;
  return call;
}

// PyTorch's rule for gather's and scatter's lists: given on the root only.
void check_root_list(const std::vector<at::Tensor>& list, bool is_root, const char* op, const char* name,
                     const char* root) {
  if (is_root && list.empty())
    throw UsageError(dist_who(op) + "Argument `" + name + "` must be specified on " + root + " rank.");
  if (!is_root && !list.empty())
    throw UsageError(dist_who(op) + "Argument `" + name + "` must NOT be specified on non-" + root + " ranks.");
}

// The global ranks of every group new_group made in this process, so that
// its ProcessGroup, passed where a Group goes, still translates src and dst.
struct Subgroups {
  std::mutex mutex;
  std::map<const ProcessGroup*, std::pair<std::weak_ptr<ProcessGroup>, std::vector<int>>> ranks;
};

Subgroups& subgroups() {
  static Subgroups* s = new Subgroups;  // leaked: groups may outlive static destruction
  return *s;
}

}  // namespace

// ---- Group ---------------------------------------------------------------------

Group::Group(std::shared_ptr<ProcessGroup> pg) : pg_(std::move(pg)) {
  if (!pg_) return;
  auto& known = subgroups();
  std::lock_guard<std::mutex> lock(known.mutex);
  const auto it = known.ranks.find(pg_.get());
  if (it != known.ranks.end() && it->second.first.lock() == pg_) {
    subgroup_ = true;
    ranks_ = it->second.second;
  }
}

Group Group::of_ranks(std::shared_ptr<ProcessGroup> pg, std::vector<int> ranks) {
  Group g;
  g.pg_ = std::move(pg);
  g.subgroup_ = true;
  g.ranks_ = std::move(ranks);
  return g;
}

std::shared_ptr<ProcessGroup> Group::process_group() const {
  if (is_default()) return default_process_group();
  return pg_;
}

std::vector<int> Group::ranks() const {
  if (subgroup_) return ranks_;
  std::vector<int> all(static_cast<size_t>(process_group()->size()));
  for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

// ---- what this build and launch have -------------------------------------------

bool is_available() { return true; }
bool is_gloo_available() { return true; }

bool is_nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

bool is_mpi_available() {
#ifdef DDP_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool is_torchelastic_launched() { return std::getenv("TORCHELASTIC_RUN_ID") != nullptr; }

// ---- the group -------------------------------------------------------------------

int get_rank(const Group& group) {
  const auto pg = group.process_group();
  return pg ? pg->rank() : -1;
}

int get_world_size(const Group& group) {
  const auto pg = group.process_group();
  return pg ? pg->size() : -1;
}

std::string get_backend(const Group& group) {
  const auto pg = group.process_group();
  if (!pg) throw UsageError(dist_who("get_backend") + "Invalid process group specified: this rank is not in the group");
  return pg->backend_name();
}

int get_group_rank(const Group& group, int global_rank) {
  const auto ranks = group.ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global_rank);
  if (it == ranks.end())
    throw UsageError(dist_who("get_group_rank") + "global rank " + std::to_string(global_rank) + " is not in the group");
  return static_cast<int>(it - ranks.begin());
}

int get_global_rank(const Group& group, int group_rank) {
  const auto ranks = group.ranks();
  if (group_rank < 0 || group_rank >= static_cast<int>(ranks.size()))
    throw UsageError(dist_who("get_global_rank") + "group rank " + std::to_string(group_rank) + " is not in the group (" +
                     std::to_string(ranks.size()) + " ranks)");
  return ranks[static_cast<size_t>(group_rank)];
}

std::vector<int> get_process_group_ranks(const Group& group) { return group.ranks(); }

// new_group's backend: "" for the default group's, else gloo, nccl or mpi
// (in any case, as PyTorch's Backend()).
std::string backend_asked(const std::string& backend, const ProcessGroup& world) {
  if (backend.empty()) return "";
  const std::string parsed = detail::parse_backend_name(backend, false, dist_who("new_group"));
  return parsed == world.backend_name() ? "" : parsed;
}

Group new_group(std::vector<int> ranks, std::optional<std::chrono::milliseconds> timeout, std::string backend) {
  const auto world = default_process_group();
  if (ranks.empty())
    for (int r = 0; r < world->size(); ++r) ranks.push_back(r);
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world->size())
      throw UsageError(dist_who("new_group") + "rank " + std::to_string(ranks[i]) + " is not a rank of the job (world size " +
                       std::to_string(world->size()) + ")");
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw UsageError(dist_who("new_group") + "rank " + std::to_string(ranks[i]) + " is listed twice");
  }
  if (timeout && timeout->count() <= 0)
    throw UsageError(dist_who("new_group") + "the timeout must be positive, got " + std::to_string(timeout->count()) +
                     " ms");
  const auto wait = timeout.value_or(world->timeout());
  const std::string other = backend_asked(backend, *world);
  const auto parent = other.empty() ? world : detail::job_group_of_backend(other, wait);
  auto pg = parent->new_subgroup(ranks, wait);
  if (pg) {
    auto& known = subgroups();
    std::lock_guard<std::mutex> lock(known.mutex);
    for (auto it = known.ranks.begin(); it != known.ranks.end();)
      it = it->second.first.expired() ? known.ranks.erase(it) : std::next(it);
    known.ranks[pg.get()] = {pg, ranks};
  }
  return Group::of_ranks(std::move(pg), std::move(ranks));
}

namespace {

// new_subgroups' default size: the ranks on this node, as the launch
// environment that the default group came from says.
int ranks_on_this_node(const ProcessGroup& world) {
  const LaunchEnv env = LaunchEnv::from_environment();
  if (env.rank != world.rank() || env.world_size != world.size())
    throw UsageError(dist_who("new_subgroups") + "the ranks on this node are unknown: the launch environment (rank " +
                     std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                     ") is not the default group's; pass group_size");
  return env.local_world_size;
}

}  // namespace

std::pair<Group, std::vector<Group>> new_subgroups(std::optional<int> group_size, const Group& group,
                                                   std::optional<std::chrono::milliseconds> timeout,
                                                   std::string backend) {
  const int size = group_size ? *group_size : ranks_on_this_node(*default_process_group());
  const std::vector<int> ranks = group.ranks();
  const int world = static_cast<int>(ranks.size());
  const std::string what = group_size ? "group_size " : "group_size (LOCAL_WORLD_SIZE, the ranks on this node) ";
  if (size <= 0) throw UsageError(dist_who("new_subgroups") + what + std::to_string(size) + " must be positive");
  if (size > world || world % size != 0)
    throw UsageError(dist_who("new_subgroups") + what + std::to_string(size) + " must divide the group's size " +
                     std::to_string(world) + (size > world ? " (it exceeds it)" : ""));
  const int me = default_process_group()->rank();
  std::pair<Group, std::vector<Group>> out{Group::of_ranks(nullptr, {}), {}};
  for (int first = 0; first < world; first += size) {
    std::vector<int> members(ranks.begin() + first, ranks.begin() + first + size);
    const bool mine = std::find(members.begin(), members.end(), me) != members.end();
    out.second.push_back(new_group(std::move(members), timeout, backend));
    if (mine) out.first = out.second.back();
  }
  return out;
}

Work barrier(const Group& group, bool async_op) { return run(make(Kind::Barrier, {}), group, async_op); }

void monitored_barrier(const Group& group, std::optional<std::chrono::milliseconds> timeout, bool wait_all_ranks) {
  if (timeout && timeout->count() <= 0)
    throw UsageError(dist_who("monitored_barrier") + "the timeout must be positive, got " +
                     std::to_string(timeout->count()) + " ms");
  auto call = make(Kind::MonitoredBarrier, {});
  call.timeout = timeout.value_or(std::chrono::milliseconds(0));
  call.wait_all_ranks = wait_all_ranks;
  (void)run(std::move(call), group, false);
}

Reduction make_nccl_premul_sum(double factor) {
  Reduction r(ReduceOp::PREMUL_SUM);
  r.factor_ = factor;
  r.has_factor_ = true;
  return r;
}

// ---- collectives -------------------------------------------------------------------

Work all_reduce(const at::Tensor& tensor, Reduction op, const Group& group, bool async_op) {
  check_tensor(tensor, "all_reduce");
  return run(make(Kind::AllReduce, {tensor}, {}, op), group, async_op);
}

Work reduce(const at::Tensor& tensor, int dst, Reduction op, const Group& group, bool async_op) {
  check_tensor(tensor, "reduce");
  const int root = dist_root_of(group, dst, "reduce", "dst");
  return run(make(Kind::Reduce, {tensor}, {}, op, root), group, async_op);
}

Work broadcast(const at::Tensor& tensor, int src, const Group& group, bool async_op) {
  check_tensor(tensor, "broadcast");
  const int root = dist_root_of(group, src, "broadcast", "src");
  return run(make(Kind::Broadcast, {tensor}, {}, ReduceOp::SUM, root), group, async_op);
}

Work all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group,
                bool async_op) {
  check_tensor(tensor, "all_gather");
  check_list(tensor_list, "all_gather", "tensor_list");
  return run(make(Kind::AllGather, {tensor}, tensor_list), group, async_op);
}

Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const Group& group, bool async_op) {
  check_tensor(output, "all_gather_into_tensor", "output tensor");
  check_tensor(input, "all_gather_into_tensor", "input tensor");
  return run(make(Kind::AllGatherIntoTensor, {input}, {output}), group, async_op);
}

Work gather(const at::Tensor& tensor, const std::vector<at::Tensor>& gather_list, int dst, const Group& group,
            bool async_op) {
  check_tensor(tensor, "gather");
  check_list(gather_list, "gather", "gather_list");
  const int root = dist_root_of(group, dst, "gather", "dst");
  if (root >= 0) check_root_list(gather_list, get_rank(group) == root, "gather", "gather_list", "destination");
  return run(make(Kind::Gather, {tensor}, gather_list, ReduceOp::SUM, root), group, async_op);
}

Work scatter(const at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src, const Group& group,
             bool async_op) {
  check_tensor(tensor, "scatter");
  check_list(scatter_list, "scatter", "scatter_list");
  const int root = dist_root_of(group, src, "scatter", "src");
  if (root >= 0) check_root_list(scatter_list, get_rank(group) == root, "scatter", "scatter_list", "source");
  return run(make(Kind::Scatter, scatter_list, {tensor}, ReduceOp::SUM, root), group, async_op);
}

Work reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list, Reduction op,
                    const Group& group, bool async_op) {
  check_tensor(output, "reduce_scatter", "output tensor");
  check_list(input_list, "reduce_scatter", "input_list");
  return run(make(Kind::ReduceScatter, input_list, {output}, op), group, async_op);
}

Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, Reduction op, const Group& group,
                           bool async_op) {
  check_tensor(output, "reduce_scatter_tensor", "output tensor");
  check_tensor(input, "reduce_scatter_tensor", "input tensor");
  return run(make(Kind::ReduceScatterTensor, {input}, {output}, op), group, async_op);
}

Work all_to_all(const std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                const Group& group, bool async_op) {
  check_list(output_list, "all_to_all", "output_tensor_list");
  check_list(input_list, "all_to_all", "input_tensor_list");
  return run(make(Kind::AllToAll, input_list, output_list), group, async_op);
}

Work all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes, const std::vector<int64_t>& input_split_sizes,
                       const Group& group, bool async_op) {
  check_tensor(output, "all_to_all_single", "output tensor");
  check_tensor(input, "all_to_all_single", "input tensor");
  auto call = make(Kind::AllToAllSingle, {input}, {output});
  call.output_split_sizes = output_split_sizes;
  call.input_split_sizes = input_split_sizes;
  return run(std::move(call), group, async_op);
}

// ---- point to point -----------------------------------------------------------------

namespace {

// A send or receive of `t` with the peer `peer` (global; -1: a receive from
// any rank), as the group's call, or nullopt where this rank is not in it.
std::optional<CollectiveCall> p2p_call(Kind kind, const at::Tensor& t, int peer, const Group& g, int tag,
                                       const char* op) {
  check_tensor(t, op);
  if (!g.is_member()) {
    dist_warn_not_in_group(op);
    return std::nullopt;
  }
  const int root = peer < 0 ? -1 : dist_root_of(g, peer, op, kind == Kind::Send ? "dst" : "src");
  const at::Tensor flat = t.is_complex() ? at::view_as_real(t) : t;  // as PyTorch 2.x
  auto call = kind == Kind::Send ? make(kind, {flat}) : make(kind, {}, {flat});
  call.root = root;
  call.tag = tag;
  return call;
}

Work start_p2p(Kind kind, const at::Tensor& t, int peer, const Group& g, int tag, const char* op) {
  auto call = p2p_call(kind, t, peer, g, tag, op);
  if (!call) return Work();
  return g.process_group()->collective(*call);
}

}  // namespace

void send(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  if (group.is_member() && dst == get_global_rank(group, get_rank(group)))
    throw UsageError(dist_who("send") + "Invalid destination rank: destination rank should not be the same as the rank "
                     "of the current process (a blocking send to itself could never be received; isend can)");
  start_p2p(Kind::Send, tensor, dst, group, tag, "send").wait();
}

int recv(const at::Tensor& tensor, std::optional<int> src, const Group& group, int tag) {
  Work work = start_p2p(Kind::Recv, tensor, src.value_or(-1), group, tag, "recv");
  if (!group.is_member()) return -1;
  work.wait();
  return src ? *src : get_global_rank(group, work.source_rank());
}

Work isend(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  return start_p2p(Kind::Send, tensor, dst, group, tag, "isend");
}

Work irecv(const at::Tensor& tensor, std::optional<int> src, const Group& group, int tag) {
  return start_p2p(Kind::Recv, tensor, src.value_or(-1), group, tag, "irecv");
}

P2POp::P2POp(Isend op, at::Tensor tensor, int peer, Group group, int tag)
    : send_(true), tensor_(std::move(tensor)), peer_(peer), group_(std::move(group)), tag_(tag) {
  if (op != &isend)
    throw UsageError(dist_who("P2POp") + "Invalid ``op``. Expected ``op`` to be of type ``dist::isend`` or ``dist::irecv``.");
  check_tensor(tensor_, "P2POp");
}

P2POp::P2POp(Irecv op, at::Tensor tensor, int peer, Group group, int tag)
    : send_(false), tensor_(std::move(tensor)), peer_(peer), group_(std::move(group)), tag_(tag) {
  if (op != &irecv)
    throw UsageError(dist_who("P2POp") + "Invalid ``op``. Expected ``op`` to be of type ``dist::isend`` or ``dist::irecv``.");
  check_tensor(tensor_, "P2POp");
}

std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& p2p_op_list) {
  if (p2p_op_list.empty()) throw UsageError(dist_who("batch_isend_irecv") + "the list of P2POp is empty");
  const auto& group = p2p_op_list.front().group();
  const auto pg = group.process_group();
  std::vector<CollectiveCall> calls;
  for (const auto& p : p2p_op_list) {
    if (p.group().process_group() != pg)
      throw UsageError(dist_who("batch_isend_irecv") + "All ops need to use the same group.");
    auto call = p2p_call(p.is_send() ? Kind::Send : Kind::Recv, p.tensor(), p.peer(), group, p.tag(),
                         p.is_send() ? "isend" : "irecv");
    if (call) calls.push_back(std::move(*call));
  }
  if (calls.empty()) return {};
  return pg->coalesced(calls);
}

}  // namespace ddp::dist

