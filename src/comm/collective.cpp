// The names of ReduceOp and of ddp::dist's collectives, and what a
// ProcessGroup without them says.
#include "ddp/comm/process_group.h"

namespace ddp {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
  }
  return "?";
}

const char* collective_name(CollectiveCall::Kind kind) {
  using Kind = CollectiveCall::Kind;
  switch (kind) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Reduce: return "reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::AllGather: return "all_gather";
    case Kind::AllGatherIntoTensor: return "all_gather_into_tensor";
    case Kind::Gather: return "gather";
    case Kind::Scatter: return "scatter";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::ReduceScatterTensor: return "reduce_scatter_tensor";
    case Kind::AllToAll: return "all_to_all";
    case Kind::AllToAllSingle: return "all_to_all_single";
    case Kind::Barrier: return "barrier";
    case Kind::MonitoredBarrier: return "monitored_barrier";
    case Kind::Send: return "send";
    case Kind::Recv: return "recv";
  }
  return "?";
}

Work ProcessGroup::collective(const CollectiveCall& call) {
  throw UsageError(rank_tag(*this) + ": dist." + collective_name(call.kind) + ": this process group (" +
                   backend_name() + ") has only the collectives DDP needs; use a group made by "
                   "ddp::init_process_group or dist::new_group");
}

std::vector<Work> ProcessGroup::coalesced(const std::vector<CollectiveCall>& calls) {
  std::vector<Work> works;
  for (const auto& call : calls) works.push_back(collective(call));
  return works;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>&, std::chrono::milliseconds) {
  throw UsageError(rank_tag(*this) + ": dist.new_group: this process group (" + backend_name() +
                   ") cannot make subgroups; use a group made by ddp::init_process_group");
}

}  // namespace ddp
