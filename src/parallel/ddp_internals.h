// DistributedDataParallelBase's state beyond what its public header shows:
// the reducer, ddp::Join's fields, the step-memory probe and what
// construction recorded for the logging data. For the library's own files,
// and for tests that look at the reducer (its buckets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "parallel/reducer/reducer.h"

namespace ddp {

struct DistributedDataParallelBase::Internals {
  // The module's buffers but the ignored ones, read again before each
  // broadcast (a submodule replaced after wrapping brings its own), as PyTorch's
  // _assign_modules_buffers.
  std::vector<at::Tensor> buffers;
  std::unordered_set<std::string> ignored;  // params_and_buffers_to_ignore
  std::vector<at::Tensor> state;  // parameters, then buffers: what the final Join sync broadcasts
  std::unique_ptr<Reducer> reducer;
  int64_t forward_start_us = 0;
  DDPLoggingData logging_data;  // what construction knows
  // ddp::Join: join_hook() was asked for; whether backward divides by the
  // ranks still training; the forward's all-reduce telling joined ranks
  // whether the backward synchronises.
  bool joined_up = false;
  bool divide_by_initial_world_size = true;
  Work join_sync_work;
  // The last forward built a graph and synchronised (or none ran yet): the
  // next forward broadcasts the buffers. PyTorch's require_forward_param_sync.
  bool require_forward_param_sync = true;
  // Bytes malloc had handed out before the first forward that builds a graph,
  // and whether that forward is still to tell retain_step_memory() its size.
  std::size_t bytes_before_first_forward = 0;
  bool step_memory_pending = false;
  // A recoverable group's generation at the last forward (ddp/comm/recovery.h):
  // when it re-formed since, the step that failed is dropped first.
  int group_generation = 0;
};

inline DistributedDataParallelBase::Internals& internals_of(DistributedDataParallelBase& ddp) {
  return *ddp.internals_;
}
inline Reducer& reducer_of(DistributedDataParallelBase& ddp) { return *internals_of(ddp).reducer; }

namespace detail {

// What PyTorch's Logger::set_construction_data_and_log records (logging_data.cpp).
DDPLoggingData construction_logging_data(const torch::nn::Module& module, const ProcessGroup& pg,
                                         const DistributedDataParallelOptions& options,
                                         const std::vector<at::Tensor>& params, const ReducerStats& initial);

}  // namespace detail
}  // namespace ddp
