#include "comm/backend/c10d_process_group.h"

#include <algorithm>

#include "comm/group/registry.h"

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ddp::detail {

namespace {

c10d::ReduceOp to_c10d(const CollectiveCall& call) {
  switch (call.op) {
    case ReduceOp::SUM: return c10d::ReduceOp::SUM;
    case ReduceOp::AVG: return c10d::ReduceOp::AVG;
    case ReduceOp::PRODUCT: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::BAND: return c10d::ReduceOp::BAND;
    case ReduceOp::BOR: return c10d::ReduceOp::BOR;
    case ReduceOp::BXOR: return c10d::ReduceOp::BXOR;
    case ReduceOp::PREMUL_SUM: return c10d::makeNCCLPreMulSum(call.premul_factor);
  }
  return c10d::ReduceOp::SUM;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// c10::Error's text without LibTorch's backtrace.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// The collectives that reduce, by the call's ReduceOp.
c10::intrusive_ptr<c10d::Work> start_reduction(compat::Backend& backend, const CollectiveCall& call,
                                               std::vector<at::Tensor>& in, std::vector<at::Tensor>& out) {
  using Kind = CollectiveCall::Kind;
  switch (call.kind) {
    case Kind::AllReduce: {
      c10d::AllreduceOptions opts;
      opts.reduceOp = to_c10d(call);
      return backend.allreduce(in, opts);
    }
    case Kind::Reduce: {
      c10d::ReduceOptions opts;
      opts.reduceOp = to_c10d(call);
      opts.rootRank = call.root;
      return backend.reduce(in, opts);
    }
    case Kind::ReduceScatter: {
      std::vector<std::vector<at::Tensor>> lists{in};
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(call);
      return backend.reduce_scatter(out, lists, opts);
    }
    case Kind::ReduceScatterTensor: {
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(call);
      return backend._reduce_scatter_base(out.at(0), in.at(0), opts);
    }
    default: break;
  }
  throw UsageError("unknown collective");
}

}  // namespace

C10dProcessGroup::C10dProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<compat::Backend> backend,
                                   std::string name, torch::Device device, std::chrono::milliseconds timeout,
                                   std::string prefix, GlooDevices gloo_devices)
    : store_(std::move(store)),
      backend_(std::move(backend)),
      rank_(backend_->getRank()),
      size_(backend_->getSize()),
      name_(std::move(name)),
      device_(device),
      timeout_(timeout),
      prefix_(std::move(prefix)),
      gloo_devices_(std::move(gloo_devices)) {}

compat::Backend& C10dProcessGroup::live(const char* op) const {
  if (!backend_)
    throw UsageError("rank " + std::to_string(rank_) + ": " + op + " on a " + name_ +
                     " process group that destroy_process_group() has shut down: make a new one with "
                     "init_process_group() (or dist::new_group) and use that");
  return *backend_;
}

void C10dProcessGroup::shutdown() {
  for (auto& weak : made_) {
    if (auto subgroup = weak.lock()) {
      GroupRegistry::instance().run_before_shutdown(*subgroup);
      subgroup->shutdown();
    }
  }
  made_.clear();
  if (!backend_) return;
  compat::shutdown_backend(*backend_);
  backend_.reset();
}

void C10dProcessGroup::abort() {
  if (auto backend = backend_) compat::abort_backend(*backend);
}

Work C10dProcessGroup::wrap(c10::intrusive_ptr<c10d::Work> work, const char* op) {
  return detail::make_work(std::move(work), name_ + " " + op, rank());
}

Work C10dProcessGroup::allreduce(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return wrap(live("allreduce").allreduce(tensors), "allreduce");
}

Work C10dProcessGroup::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return wrap(live("broadcast").broadcast(tensors, opts), "broadcast");
}

std::vector<at::Tensor> C10dProcessGroup::allgather(const at::Tensor& tensor) {
  std::vector<at::Tensor> inputs{tensor};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  wrap(live("allgather").allgather(outputs, inputs), "allgather").wait();
  return outputs[0];
}

void C10dProcessGroup::barrier() { wrap(live("barrier").barrier(), "barrier").wait(); }

// c10d's call of the same name. Its argument checks throw here, at the
// start; Gloo's refusals of AVG and of bitwise ops on floating tensors would
// come only from wait(), and leave the group unusable, so collective()
// refuses them before anything starts.
c10::intrusive_ptr<c10d::Work> C10dProcessGroup::start(const CollectiveCall& call) {
  using Kind = CollectiveCall::Kind;
  compat::Backend& backend = *backend_;  // collective() found it live
  auto in = call.inputs;
  auto out = call.outputs;
  switch (call.kind) {
    case Kind::AllReduce:
    case Kind::Reduce:
    case Kind::ReduceScatter:
    case Kind::ReduceScatterTensor: return start_reduction(backend, call, in, out);
    case Kind::Broadcast: {
      c10d::BroadcastOptions opts;
      opts.rootRank = call.root;
      return backend.broadcast(in, opts);
    }
    case Kind::AllGather: {
      std::vector<std::vector<at::Tensor>> lists{out};
      return backend.allgather(lists, in);
    }
    case Kind::AllGatherIntoTensor: return backend._allgather_base(out.at(0), in.at(0));
    case Kind::Gather: {
      std::vector<std::vector<at::Tensor>> lists;
      if (rank() == call.root) lists.push_back(out);
      c10d::GatherOptions opts;
      opts.rootRank = call.root;
      return backend.gather(lists, in, opts);
    }
    case Kind::Scatter: {
      std::vector<std::vector<at::Tensor>> lists;
      if (rank() == call.root) lists.push_back(in);
      c10d::ScatterOptions opts;
      opts.rootRank = call.root;
      return backend.scatter(out, lists, opts);
    }
    case Kind::AllToAll: return backend.alltoall(out, in);
    case Kind::AllToAllSingle: {
      auto out_splits = call.output_split_sizes;
      auto in_splits = call.input_split_sizes;
      return backend.alltoall_base(out.at(0), in.at(0), out_splits, in_splits);
    }
    case Kind::Barrier: return backend.barrier();
    case Kind::Send: return backend.send(in, call.root, call.tag);
    case Kind::Recv:
      if (call.root < 0) return backend.recvAnysource(out, call.tag);
      return backend.recv(out, call.root, call.tag);
    case Kind::MonitoredBarrier: break;  // monitored_barrier(): blocking, no Work
  }
  throw UsageError("unknown collective");
}

// What a backend lacks, refused before anything starts (as PyTorch's
// Python layer refuses it, or where c10d would fail only in wait() and leave
// the group unusable).
void C10dProcessGroup::refuse_unsupported(const CollectiveCall& call, const std::string& who) const {
  using Kind = CollectiveCall::Kind;
  const bool reduces = call.kind == Kind::AllReduce || call.kind == Kind::Reduce || call.kind == Kind::ReduceScatter ||
                       call.kind == Kind::ReduceScatterTensor;
  if (name_ == "gloo" && reduces && call.op == ReduceOp::AVG)
    throw UsageError(who + "ReduceOp::AVG is NCCL's only, as in PyTorch (\"Cannot use ReduceOp.AVG with Gloo\"): "
                     "reduce with ReduceOp::SUM and divide by dist::get_world_size(group)");
  if (name_ != "nccl" && reduces && call.op == ReduceOp::PREMUL_SUM)
    throw UsageError(who + "ReduceOp::PREMUL_SUM is NCCL's only, as in PyTorch (\"Cannot use ReduceOp.PREMUL_SUM "
                     "with Gloo\"): multiply by the factor and reduce with ReduceOp::SUM");
  if (call.kind == Kind::MonitoredBarrier && name_ != "gloo")
    throw UsageError(who + "monitored_barrier is only implemented for GLOO backend, as in PyTorch: make a gloo "
                     "group beside this one (dist::new_group(ranks, timeout, \"gloo\")) and call it there");
  if (call.kind == Kind::Recv && call.root < 0 && name_ == "nccl")
    throw UsageError(who + "NCCL cannot receive from any source (ProcessGroupNCCL does not support recvAnysource): "
                     "name the sender (src), or receive over a gloo group (dist::new_group(ranks, timeout, \"gloo\"))");
  const bool bitwise = call.op == ReduceOp::BAND || call.op == ReduceOp::BOR || call.op == ReduceOp::BXOR;
  if (name_ == "gloo" && bitwise)
    for (const auto* list : {&call.inputs, &call.outputs})
      for (const auto& t : *list)
        if (t.defined() && !c10::isIntegralType(t.scalar_type(), /*includeBool=*/false))
          throw UsageError(who + "ReduceOp::" + reduce_op_name(call.op) + " needs integer tensors, not " +
                           c10::toString(t.scalar_type()) + " (\"Cannot use ReduceOp." + reduce_op_name(call.op) +
                           " with non-integral dtype\")");
}

// Gloo's monitored barrier: rank 0 waits for every other rank's message
// until the timeout and names the ranks that did not send it. Blocking, as
// in PyTorch.
Work C10dProcessGroup::monitored_barrier(const CollectiveCall& call, const std::string& who) {
  c10d::BarrierOptions opts;
  opts.timeout = call.timeout.count() > 0 ? call.timeout : timeout_;
  try {
    backend_->monitoredBarrier(opts, call.wait_all_ranks);
  } catch (const std::exception& e) {
    const std::string hint = rank_ == 0 ? "the ranks named did not reach monitored_barrier within " +
                                              std::to_string(opts.timeout.count()) +
                                              " ms: each one's own log says where it is"
                                        : "rank 0 gave up waiting for the ranks that did not come; its log names them";
    throw CommError(who + first_line(message_of(e)) + "\n  (" + hint + ")");
  }
  return Work();
}

Work C10dProcessGroup::collective(const CollectiveCall& call) {
  const std::string op = collective_name(call.kind);
  const std::string who = "rank " + std::to_string(rank()) + ": dist." + op + " on " + name_ + ": ";
  live(("dist." + op).c_str());
  refuse_unsupported(call, who);
  if (call.kind == CollectiveCall::Kind::MonitoredBarrier) return monitored_barrier(call, who);
  if (call.kind == CollectiveCall::Kind::Send || call.kind == CollectiveCall::Kind::Recv)
    return detail::make_p2p_work(started(call, who), name_, call, rank());
  return detail::make_work(started(call, who), name_ + " " + op, rank());
}

// start(), its refusals turned into UsageError and the backend's failures
// into CommError, both naming the rank.
c10::intrusive_ptr<c10d::Work> C10dProcessGroup::started(const CollectiveCall& call, const std::string& who) {
  try {
    return start(call);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    if (compat::is_backend_failure(e)) throw CommError(who + "the backend failed to start it: " + message_of(e));
    throw UsageError(who + first_line(message_of(e)) +
                     "\n  (c10d refused it before it started; where PyTorch's backend lacks an operation, "
                     "docs/api.md's table of ddp::dist says which backend has it)");
  }
}

// NCCL's sends and receives of one batch go in one group; the other
// backends start each by itself, as PyTorch's batch_isend_irecv.
std::vector<Work> C10dProcessGroup::coalesced(const std::vector<CollectiveCall>& calls) {
  if (name_ != "nccl") return ProcessGroup::coalesced(calls);
  live("dist.batch_isend_irecv");
  for (const auto& call : calls)
    refuse_unsupported(call, "rank " + std::to_string(rank()) + ": dist.batch_isend_irecv on nccl: ");
  std::vector<c10::intrusive_ptr<c10d::Work>> started_works;
  compat::start_coalescing(*backend_);
  try {
    for (const auto& call : calls)
      started_works.push_back(started(call, "rank " + std::to_string(rank()) + ": dist.batch_isend_irecv on nccl: "));
  } catch (...) {
    compat::end_coalescing(*backend_, started_works);  // the group is closed whatever happened in it, as PyTorch's
    throw;
  }
  auto whole = compat::end_coalescing(*backend_, started_works);
  std::vector<Work> works;
  for (size_t i = 0; i < started_works.size(); ++i)
    if (started_works[i]) works.push_back(detail::make_p2p_work(std::move(started_works[i]), name_, calls[i], rank()));
  if (whole) works.push_back(detail::make_work(std::move(whole), name_ + " batch_isend_irecv", rank()));
  return works;
}

std::shared_ptr<ProcessGroup> C10dProcessGroup::new_subgroup(const std::vector<int>& ranks,
                                                             std::chrono::milliseconds timeout) {
  live("dist.new_group");
  const std::string prefix = prefix_ + "_sub" + std::to_string(subgroups_++);
  const auto it = std::find(ranks.begin(), ranks.end(), rank());
  std::shared_ptr<ProcessGroup> group;
  if (it != ranks.end()) {
    const int sub_rank = static_cast<int>(it - ranks.begin());
    const int sub_size = static_cast<int>(ranks.size());
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    c10::intrusive_ptr<compat::Backend> backend;
    try {
      if (name_ == "gloo") {
#ifdef USE_C10D_GLOO
        auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
        opts->devices = gloo_devices_;
        backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, sub_rank, sub_size, opts);
#endif
      } else {
#ifdef USE_C10D_NCCL
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = timeout;
        backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, sub_rank, sub_size, opts);
#endif
      }
    } catch (const std::exception& e) {
      throw CommError("rank " + std::to_string(rank()) + ": dist.new_group: the " + std::to_string(sub_size) +
                      " ranks of the new group did not all connect within the timeout: " + first_line(e.what()) +
                      "\n  (every rank of the job must call new_group with the same ranks, in the same order)");
    }
    if (!backend) throw UsageError("rank " + std::to_string(rank()) + ": dist.new_group: no " + name_ + " in this build");
    group = std::make_shared<C10dProcessGroup>(store_, backend, name_, device_, timeout, prefix, gloo_devices_);
    made_.push_back(group);
  }
  // As PyTorch's new_group: every rank of the parent leaves it together, met
  // in the store rather than by a collective (which under NCCL would make a
  // communicator on a device of NCCL's guessing).
  try {
    const std::string arrived = prefix + "_arrived", all = prefix + "_all";
    if (store_->add(arrived, 1) == size()) store_->set(all, std::vector<uint8_t>{1});
    store_->wait({all}, timeout);
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(rank()) + ": dist.new_group: not every rank of the job called it within " +
                    std::to_string(timeout.count()) + " ms (" + first_line(message_of(e)) +
                    ")\n  (every rank must call new_group with the same ranks, in the same order)");
  }
  return group;
}

}  // namespace ddp::detail
