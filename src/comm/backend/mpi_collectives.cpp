// The mpi backend's share of ddp::dist: every collective of
// torch.distributed on MPI's non-blocking ones (MPI_Ireduce, MPI_Igatherv,
// MPI_Iscatterv, MPI_Ialltoallv, MPI_Ireduce_scatter_block, ...), and
// new_group's subgroups (MPI_Comm_split, entered only after an
// MPI_Ibarrier bounded by the timeout shows every rank has come). Tensors
// of a list travel as one flat byte buffer; sizes may differ by rank where
// MPI's "v" collectives allow it (all_gather, gather, scatter, all_to_all).
#include "comm/backend/mpi_group.h"

#ifdef DDP_WITH_MPI

#include <algorithm>
#include <cstring>
#include <numeric>

namespace ddp::detail::mpi {

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// A contiguous CPU copy of `t`, or `t` itself when it is one.
at::Tensor host(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous() ? t : t.to(at::kCPU).contiguous(); }

// The list's tensors, one after another, as bytes.
at::Tensor flat_bytes(const std::vector<at::Tensor>& list) {
  int64_t total = 0;
  for (const auto& t : list) total += nbytes(t);
  auto flat = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  int64_t at = 0;
  for (const auto& t : list) {
    const auto h = host(t);
    if (nbytes(h) > 0) std::memcpy(static_cast<uint8_t*>(flat.data_ptr()) + at, h.data_ptr(), nbytes(h));
    at += nbytes(h);
  }
  return flat;
}

// Copies `flat`'s bytes back into the list's tensors, in order.
void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& list, const std::vector<int64_t>& offsets) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].numel() == 0) continue;
    auto bytes = flat.narrow(0, offsets[i], nbytes(list[i]));
    auto typed = at::empty(list[i].sizes(), list[i].options().device(at::kCPU));
    std::memcpy(typed.data_ptr(), bytes.data_ptr(), static_cast<size_t>(nbytes(list[i])));
    list[i].copy_(typed);
  }
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> out(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) out[i] = out[i - 1] + counts[i - 1];
  return out;
}

}  // namespace

Work MpiProcessGroup::collective(const CollectiveCall& call) {
  const std::string who = "rank " + std::to_string(rank_) + ": dist." + collective_name(call.kind) + " on mpi: ";
  if (call.kind == CollectiveCall::Kind::MonitoredBarrier)
    throw UsageError(who + "monitored_barrier is only implemented for GLOO backend, as in PyTorch: make a gloo "
                     "group beside this one (dist::new_group(ranks, timeout, \"gloo\")) and call it there");
  for (const auto* list : {&call.inputs, &call.outputs})
    for (const auto& t : *list) check(t, collective_name(call.kind));
  return start_collective(call, who);
}

namespace {

using Kind = CollectiveCall::Kind;

// A check of the call: UsageError(who + what) unless ok.
void need(bool ok, const std::string& who, const std::string& what) {
  if (!ok) throw UsageError(who + what);
}

void same_dtype(const std::vector<at::Tensor>& list, const at::Tensor& as, const char* what, const std::string& who) {
  for (const auto& t : list)
    need(t.scalar_type() == as.scalar_type(), who, std::string("every tensor of ") + what + " must be " +
                                                     c10::toString(as.scalar_type()) + ", as the other side; got " +
                                                     c10::toString(t.scalar_type()));
}

// MPI's operation for the call's ReduceOp on an integer or floating type.
MPI_Op mpi_op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::PRODUCT: return MPI_PROD;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::BAND: return MPI_BAND;
    case ReduceOp::BOR: return MPI_BOR;
    case ReduceOp::BXOR: return MPI_BXOR;
    case ReduceOp::AVG:
    case ReduceOp::PREMUL_SUM: break;
  }
  return MPI_SUM;
}

// The MPI type and operation that reduce `t` by the call's ReduceOp; half
// and bfloat16 travel as two bytes, summed by our own operations.
std::pair<MPI_Datatype, MPI_Op> reduction(const CollectiveCall& call, const at::Tensor& t, const std::string& who) {
  if (call.op == ReduceOp::AVG)
    throw UsageError(who + "ReduceOp::AVG is NCCL's only, as in PyTorch: reduce with ReduceOp::SUM and divide by "
                     "dist::get_world_size(group)");
  if (call.op == ReduceOp::PREMUL_SUM)
    throw UsageError(who + "ReduceOp::PREMUL_SUM is NCCL's only, as in PyTorch: multiply by the factor and reduce "
                     "with ReduceOp::SUM");
  const bool integral = c10::isIntegralType(t.scalar_type(), /*includeBool=*/false);
  if ((call.op == ReduceOp::BAND || call.op == ReduceOp::BOR || call.op == ReduceOp::BXOR) && !integral)
    throw UsageError(who + "ReduceOp::" + reduce_op_name(call.op) + " needs an integer tensor, not " +
                     c10::toString(t.scalar_type()));
  MPI_Datatype type = MPI_DATATYPE_NULL;
  switch (t.scalar_type()) {
    case at::kFloat: type = MPI_FLOAT; break;
    case at::kDouble: type = MPI_DOUBLE; break;
    case at::kChar: type = MPI_INT8_T; break;
    case at::kByte: type = MPI_UINT8_T; break;
    case at::kShort: type = MPI_INT16_T; break;
    case at::kInt: type = MPI_INT32_T; break;
    case at::kLong: type = MPI_INT64_T; break;
    case at::kHalf:
    case at::kBFloat16:
      need(call.op == ReduceOp::SUM, who, std::string("the mpi backend reduces ") + c10::toString(t.scalar_type()) +
                                              " tensors by SUM only; convert to float for ReduceOp::" +
                                              reduce_op_name(call.op));
      return {runtime().two_bytes, t.scalar_type() == at::kHalf ? runtime().half_sum : runtime().bfloat16_sum};
    default:
      throw UsageError(who + "tensors of " + c10::toString(t.scalar_type()) +
                       " cannot be reduced by the mpi backend; it reduces float, double, half and bfloat16 (SUM), "
                       "int8, uint8, int16, int32 and int64 tensors");
  }
  return {type, mpi_op_of(call.op)};
}

// all_to_all_single's bytes per rank of `t`: its first dimension split
// evenly, or by `splits`.
std::vector<int64_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, const char* which, int size,
                                 const std::string& who) {
  const int64_t n = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = n == 0 ? 0 : nbytes(t) / n;
  std::vector<int64_t> bytes;
  if (splits.empty()) {
    need(n % size == 0, who, std::string("the ") + which + " tensor's first dimension (" + std::to_string(n) +
                                 ") does not divide by the world size; give split sizes");
    bytes.assign(static_cast<size_t>(size), n / size * row);
  } else {
    need(static_cast<int>(splits.size()) == size && std::accumulate(splits.begin(), splits.end(), int64_t{0}) == n,
         who, std::string("the ") + which + " split sizes must be one per rank and add up to the first dimension");
    for (auto s : splits) bytes.push_back(s * row);
  }
  return bytes;
}

}  // namespace

// MPI's count and displacement arrays, read until the collective ends: int
// tensors that the work keeps.
at::Tensor MpiProcessGroup::int_array(const std::vector<int64_t>& v, const char* op) const {
  auto out = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kInt));
  for (size_t i = 0; i < v.size(); ++i) out.data_ptr<int>()[i] = count_of(v[i], op);
  return out;
}

Work MpiProcessGroup::start_collective(const CollectiveCall& call, const std::string& who) {
  c10::intrusive_ptr<MpiWork> work;
  switch (call.kind) {
    case Kind::AllReduce:
    case Kind::Reduce: work = start_reduce(call, who); break;
    case Kind::Broadcast: work = start_broadcast(call); break;
    case Kind::AllGather:
    case Kind::Gather: work = start_gather(call, who); break;
    case Kind::AllGatherIntoTensor: work = start_all_gather_into_tensor(call, who); break;
    case Kind::Scatter: work = start_scatter(call, who); break;
    case Kind::ReduceScatter:
    case Kind::ReduceScatterTensor: work = start_reduce_scatter(call, who); break;
    case Kind::AllToAll:
    case Kind::AllToAllSingle: work = start_all_to_all(call, who); break;
    case Kind::Send:
    case Kind::Recv: work = start_p2p(call, who); break;
    case Kind::MonitoredBarrier: break;  // refused by collective()
    case Kind::Barrier: {
      at::Tensor none;
      work = start(c10d::OpType::BARRIER, collective_name(call.kind), none,
                   [&](void*, MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
      break;
    }
  }
  if (call.kind == Kind::Send || call.kind == Kind::Recv) return detail::make_p2p_work(work, "mpi", call, rank_);
  return detail::make_work(work, std::string("mpi ") + collective_name(call.kind), rank_);
}

// send and recv: the tensor's bytes to or from one rank (any rank: a
// receive whose Work then names the sender), matched by the tag.
c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_p2p(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  const bool sending = call.kind == Kind::Send;
  at::Tensor t = sending ? call.inputs.at(0) : call.outputs.at(0);
  need(call.tag >= 0, who, "the tag must not be negative, got " + std::to_string(call.tag));
  need(call.root < size_ && (call.root >= 0 || !sending), who,
       "rank " + std::to_string(call.root) + " is not a rank of the group");
  const int bytes = count_of(nbytes(t), name);
  return start(sending ? c10d::OpType::SEND : (call.root < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV), name,
               t, [&](void* data, MPI_Request* r) {
                 if (sending) return MPI_Isend(data, bytes, MPI_BYTE, call.root, call.tag, comm_, r);
                 return MPI_Irecv(data, bytes, MPI_BYTE, call.root < 0 ? MPI_ANY_SOURCE : call.root, call.tag, comm_,
                                  r);
               });
}

c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_reduce(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  const bool is_root = rank_ == call.root;
  at::Tensor t = call.inputs.at(0);
  const auto reduce_by = reduction(call, t, who);
  const int count = count_of(t.numel(), name);
  const bool all = call.kind == Kind::AllReduce;
  return start(all ? c10d::OpType::ALLREDUCE : c10d::OpType::REDUCE, name, t, [&](void* data, MPI_Request* r) {
    const auto [type, op] = reduce_by;
    if (all) return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, comm_, r);
    return MPI_Ireduce(is_root ? MPI_IN_PLACE : data, data, count, type, op, call.root, comm_, r);
  });
}

c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_broadcast(const CollectiveCall& call) {
  const char* name = collective_name(call.kind);
  at::Tensor t = call.inputs.at(0);
  const int bytes = count_of(nbytes(t), name);
  return start(c10d::OpType::BROADCAST, name, t, [&](void* data, MPI_Request* r) {
    return MPI_Ibcast(data, bytes, MPI_BYTE, call.root, comm_, r);
  });
}

// all_gather and gather: the outputs, of any sizes, travel as one flat byte
// buffer and are copied back once the collective ends.
c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_gather(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  const bool is_root = rank_ == call.root;
  const bool all = call.kind == Kind::AllGather;
  const auto in = host(call.inputs.at(0));
  std::vector<int64_t> counts;
  if (all || is_root) {
    need(static_cast<int>(call.outputs.size()) == size_, who,
         "the output list has " + std::to_string(call.outputs.size()) + " tensors, not one per rank (" +
             std::to_string(size_) + ")");
    for (const auto& t : call.outputs) counts.push_back(nbytes(t));
    same_dtype(call.outputs, in, "the output list", who);
    need(counts[rank_] == nbytes(in), who, "this rank's tensor does not match its place in the output list (size)");
  }
  const auto displs = offsets_of(counts);
  auto flat =
      at::empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})}, at::TensorOptions().dtype(at::kByte));
  const auto c = int_array(counts, name), d = int_array(displs, name);
  const int mine = count_of(nbytes(in), name);
  auto outputs = call.outputs;
  return start(all ? c10d::OpType::ALLGATHER : c10d::OpType::GATHER, name, flat,
               [&](void* data, MPI_Request* r) {
                 if (all)
                   return MPI_Iallgatherv(in.data_ptr(), mine, MPI_BYTE, data, c.data_ptr<int>(), d.data_ptr<int>(),
                                          MPI_BYTE, comm_, r);
                 return MPI_Igatherv(in.data_ptr(), mine, MPI_BYTE, data, is_root ? c.data_ptr<int>() : nullptr,
                                     is_root ? d.data_ptr<int>() : nullptr, MPI_BYTE, call.root, comm_, r);
               },
               {in, c, d}, [flat, outputs, displs] { unflatten_into(flat, outputs, displs); });
}

c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_all_gather_into_tensor(const CollectiveCall& call,
                                                                          const std::string& who) {
  const char* name = collective_name(call.kind);
  const auto in = host(call.inputs.at(0));
  at::Tensor out = call.outputs.at(0);
  need(nbytes(out) == nbytes(in) * size_ && out.scalar_type() == in.scalar_type(), who,
       "the output tensor must hold world size (" + std::to_string(size_) + ") times the input, of its dtype");
  const int bytes = count_of(nbytes(in), name);
  return start(c10d::OpType::_ALLGATHER_BASE, name, out, [&](void* data, MPI_Request* r) {
    return MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, data, bytes, MPI_BYTE, comm_, r);
  }, {in});
}

c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_scatter(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  const bool is_root = rank_ == call.root;
  at::Tensor out = call.outputs.at(0);
  std::vector<int64_t> counts;
  at::Tensor flat = at::empty({0}, at::TensorOptions().dtype(at::kByte));
  if (is_root) {
    need(static_cast<int>(call.inputs.size()) == size_, who,
         "the scatter list has " + std::to_string(call.inputs.size()) + " tensors, not one per rank (" +
             std::to_string(size_) + ")");
    for (const auto& t : call.inputs) counts.push_back(nbytes(t));
    same_dtype(call.inputs, out, "the scatter list", who);
    need(counts[rank_] == nbytes(out), who, "this rank's tensor does not match its place in the scatter list (size)");
    flat = flat_bytes(call.inputs);
  }
  const auto c = int_array(counts, name), d = int_array(offsets_of(counts), name);
  const int mine = count_of(nbytes(out), name);
  return start(c10d::OpType::SCATTER, name, out, [&](void* data, MPI_Request* r) {
    return MPI_Iscatterv(flat.data_ptr(), is_root ? c.data_ptr<int>() : nullptr, is_root ? d.data_ptr<int>() : nullptr,
                         MPI_BYTE, data, mine, MPI_BYTE, call.root, comm_, r);
  }, {flat, c, d});
}

// reduce_scatter (a list, one tensor per rank, concatenated) and
// reduce_scatter_tensor (one tensor of world size times the output).
c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_reduce_scatter(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  at::Tensor out = call.outputs.at(0);
  at::Tensor in;
  if (call.kind == Kind::ReduceScatter) {
    need(static_cast<int>(call.inputs.size()) == size_, who,
         "the input list needs one tensor per rank (" + std::to_string(size_) + ")");
    for (const auto& t : call.inputs)
      need(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(), who,
           "every tensor of the input list must match the output in size and dtype");
    std::vector<at::Tensor> flat;
    for (const auto& t : call.inputs) flat.push_back(host(t).reshape({-1}));
    in = at::cat(flat);
  } else {
    in = host(call.inputs.at(0));
    need(in.numel() == out.numel() * size_ && in.scalar_type() == out.scalar_type(), who,
         "the input tensor must hold world size (" + std::to_string(size_) + ") times the output, of its dtype");
  }
  const auto reduce_by = reduction(call, out, who);
  const int count = count_of(out.numel(), name);
  return start(call.kind == Kind::ReduceScatter ? c10d::OpType::REDUCE_SCATTER : c10d::OpType::_REDUCE_SCATTER_BASE,
               name, out, [&](void* data, MPI_Request* r) {
                 return MPI_Ireduce_scatter_block(in.data_ptr(), data, count, reduce_by.first, reduce_by.second,
                                                  comm_, r);
               }, {in});
}

// all_to_all (lists, flattened to bytes and copied back after) and
// all_to_all_single (one tensor each way, split by rows).
c10::intrusive_ptr<MpiWork> MpiProcessGroup::start_all_to_all(const CollectiveCall& call, const std::string& who) {
  const char* name = collective_name(call.kind);
  std::vector<int64_t> send, recv;
  at::Tensor in, out;
  std::vector<at::Tensor> outputs;
  if (call.kind == Kind::AllToAll) {
    need(static_cast<int>(call.inputs.size()) == size_ && static_cast<int>(call.outputs.size()) == size_, who,
         "the input and output lists need one tensor per rank (" + std::to_string(size_) + ")");
    for (const auto& t : call.inputs) send.push_back(nbytes(t));
    for (const auto& t : call.outputs) recv.push_back(nbytes(t));
    same_dtype(call.inputs, call.outputs.at(0), "the input list", who);
    same_dtype(call.outputs, call.outputs.at(0), "the output list", who);
    in = flat_bytes(call.inputs);
    out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, at::TensorOptions().dtype(at::kByte));
    outputs = call.outputs;
  } else {
    in = host(call.inputs.at(0));
    out = call.outputs.at(0);
    same_dtype({in}, out, "the input", who);
    send = split_bytes(in, call.input_split_sizes, "input", size_, who);
    recv = split_bytes(out, call.output_split_sizes, "output", size_, who);
  }
  const auto sc = int_array(send, name), sd = int_array(offsets_of(send), name);
  const auto rc = int_array(recv, name), rd = int_array(offsets_of(recv), name);
  std::function<void()> after;
  if (!outputs.empty()) after = [out, outputs, recv] { unflatten_into(out, outputs, offsets_of(recv)); };
  return start(call.kind == Kind::AllToAll ? c10d::OpType::ALLTOALL : c10d::OpType::ALLTOALL_BASE, name, out,
               [&](void* data, MPI_Request* r) {
                 return MPI_Ialltoallv(in.data_ptr(), sc.data_ptr<int>(), sd.data_ptr<int>(), MPI_BYTE, data,
                                       rc.data_ptr<int>(), rd.data_ptr<int>(), MPI_BYTE, comm_, r);
               }, {in, sc, sd, rc, rd}, std::move(after));
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::new_subgroup(const std::vector<int>& ranks,
                                                            std::chrono::milliseconds timeout) {
  live("dist.new_group");
  const std::string who = "rank " + std::to_string(rank_) + ": dist.new_group on mpi: ";
  // Every rank must have come before MPI_Comm_split, which has no bound.
  MPI_Request request = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    const int rc = MPI_Ibarrier(comm_, &request);
    if (rc != MPI_SUCCESS) throw CommError(who + "MPI_Ibarrier failed: " + error_string(rc));
  }
  wait_request(request, Clock::now() + timeout, timeout, who + "waiting for every rank to call new_group: ");
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = it != ranks.end();
  MPI_Comm sub = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    const int rc = MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank_, &sub);
    if (rc != MPI_SUCCESS) throw CommError(who + "MPI_Comm_split failed: " + error_string(rc));
    if (sub != MPI_COMM_NULL) MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  }
  if (!member) return nullptr;
  return std::make_shared<MpiProcessGroup>(sub, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                                           device_, timeout);
}

}  // namespace ddp::detail::mpi

#endif  // DDP_WITH_MPI
