// DistributedDataParallel's logging data (ddp/observe/logging_data.h): what
// PyTorch's DDP logs at construction (the model, the group, the options and
// the launch environment's variables), then the reducer's figures at each
// get_ddp_logging_data().
#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>

#include "parallel/ddp_internals.h"

namespace ddp {

namespace {

std::string env_or_na(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "N/A";  // PyTorch's parse_env
}

template <typename T>
std::string joined(const std::vector<T>& values, const char* sep = ", ") {
  std::ostringstream out;
  for (size_t k = 0; k < values.size(); ++k) out << (k ? sep : "") << values[k];
  return out.str();
}

int64_t ns(double ms) { return static_cast<int64_t>(ms * 1e6); }

}  // namespace

DDPLoggingData detail::construction_logging_data(const torch::nn::Module& module, const ProcessGroup& pg,
                                                 const DistributedDataParallelOptions& options,
                                                 const std::vector<at::Tensor>& params, const ReducerStats& initial) {
  DDPLoggingData d;
  d.strs_map["module_name"] = module.name();
  d.ints_map["world_size"] = pg.size();
  d.ints_map["rank"] = pg.rank();
  d.ints_map["is_multi_device_module"] = 0;
  d.ints_map["num_parameter_tensors"] = static_cast<int64_t>(params.size());
  int64_t total = 0;
  std::set<std::string> dtypes;
  for (const auto& p : params) {
    total += p.numel() * p.element_size();
    dtypes.insert(std::string(p.dtype().name()));
  }
  d.ints_map["total_parameter_size_bytes"] = total;
  d.strs_map["dtypes"] = joined(std::vector<std::string>(dtypes.begin(), dtypes.end()));
  d.strs_map["bucket_sizes"] = joined(initial.bucket_bytes);
  d.strs_map["master_port"] = env_or_na("MASTER_PORT");
  d.strs_map["master_addr"] = env_or_na("MASTER_ADDR");
  d.strs_map["torch_distributed_debug"] = env_or_na("TORCH_DISTRIBUTED_DEBUG");
  d.strs_map["cuda_visible_devices"] = env_or_na("CUDA_VISIBLE_DEVICES");
  if (pg.backend_name() == "nccl") {
    for (const char* v : {"NCCL_SOCKET_IFNAME", "NCCL_BLOCKING_WAIT", "NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG",
                          "NCCL_NTHREADS", "NCCL_IB_TIMEOUT"}) {
      std::string key = v;
      for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      d.strs_map[key] = env_or_na(v);
    }
  }
  if (pg.backend_name() == "gloo") {
    d.strs_map["gloo_socket_ifname"] = env_or_na("GLOO_SOCKET_IFNAME");
    d.strs_map["gloo_device_transport"] = env_or_na("GLOO_DEVICE_TRANSPORT");
    d.ints_map["gloo_num_threads"] = 2;  // c10d's ProcessGroupGloo::Options default, which init_process_group keeps
  }
  d.strs_map["device_ids"] = pg.device().is_cuda() ? std::to_string(pg.device().index()) : "";
  d.ints_map["output_device"] = pg.device().is_cuda() ? pg.device().index() : -1;
  d.ints_map["broadcast_buffers"] = options.broadcast_buffers();
  d.ints_map["has_sync_bn"] = 0;
  for (const auto& m : module.modules(true))
    if (m->name().find("SyncBatchNorm") != std::string::npos) d.ints_map["has_sync_bn"] = 1;
  d.ints_map["bucket_cap_bytes"] = static_cast<int64_t>(options.bucket_cap_mb() * 1024 * 1024);
  d.ints_map["bucket_cap_auto"] = options.bucket_cap_auto();
  d.ints_map["find_unused_parameters"] = options.find_unused_parameters();
  d.ints_map["gradient_as_bucket_view"] = options.gradient_as_bucket_view();
  d.ints_map["static_graph"] = options.static_graph();
  d.strs_map["backend_name"] = pg.backend_name();
  d.ints_map["iteration"] = 0;
  return d;
}

DDPLoggingData DistributedDataParallelBase::get_ddp_logging_data() const {
  const Reducer& reducer = *internals_->reducer;
  DDPLoggingData d = internals_->logging_data;
  const ReducerStats& s = reducer.stats();
  d.ints_map["iteration"] = s.iterations;
  d.strs_map["comm_hook"] = reducer.has_comm_hook() ? "registered" : "";
  d.ints_map["join_uneven_inputs"] = internals_->joined_up;
  d.ints_map["num_buckets"] = static_cast<int64_t>(s.num_buckets);
  // PyTorch 2.x's: the buckets the last synchronised step reduced (all but
  // those skip_all_reduce_unused_params left out), none before the first step.
  d.ints_map["num_buckets_reduced"] = s.iterations > 0 ? static_cast<int64_t>(s.num_buckets_reduced) : 0;
  // The cap in effect: "auto"'s candidate while tuning, its choice after.
  d.ints_map["bucket_cap_bytes"] = static_cast<int64_t>(s.bucket_cap_mb * 1024 * 1024);
  if (options_.bucket_cap_auto()) {
    std::vector<std::string> trials;
    for (const auto& [cap, ms] : s.bucket_cap_trials) {
      std::ostringstream t;
      t << cap << " MB: " << ms << " ms";
      trials.push_back(t.str());
    }
    d.strs_map["bucket_cap_trials"] = s.bucket_cap_tuning ? "tuning" : joined(trials);
  }
  if (s.iterations == 0) return d;
  d.ints_map["unused_parameter_size"] = s.unused_parameter_bytes;
  d.ints_map["has_rebuilt_buckets"] = s.buckets_rebuilt;
  if (s.buckets_rebuilt || options_.bucket_cap_auto()) {
    std::vector<std::string> per_bucket;
    for (const auto& b : reducer.bucket_indices()) per_bucket.push_back(joined(b, " "));
    d.strs_map["rebuilt_bucket_sizes"] = joined(s.bucket_bytes);
    d.strs_map["rebuilt_per_bucket_param_indices"] = joined(per_bucket);
  }
  if (!s.ready_order.empty()) d.strs_map["prev_iteration_grad_ready_order_indices"] = joined(s.ready_order);
  d.ints_map["forward_compute_time"] = ns(s.forward_ms);
  d.ints_map["backward_compute_time"] = ns(s.backward_compute_ms);
  d.ints_map["backward_comm_time"] = ns(s.comm_ms);
  d.ints_map["backward_compute_comm_overlap_time"] = ns(s.overlap_ms);
  d.ints_map["backward_exposed_comm_time"] = ns(s.exposed_comm_ms);
  d.ints_map["forward_compute_time_start"] = s.at_ns.forward_start;
  d.ints_map["backward_compute_time_start"] = s.at_ns.backward_compute_start;
  d.ints_map["backward_compute_time_end"] = s.at_ns.backward_compute_end;
  d.ints_map["backward_comm_time_start"] = s.at_ns.comm_start;
  d.ints_map["backward_comm_time_end"] = s.at_ns.comm_end;
  d.ints_map["avg_forward_compute_time"] = ns(s.mean.forward_ms);
  d.ints_map["avg_backward_compute_time"] = ns(s.mean.backward_compute_ms);
  d.ints_map["avg_backward_comm_time"] = ns(s.mean.comm_ms);
  d.ints_map["avg_backward_compute_comm_overlap_time"] = ns(s.mean.overlap_ms);
  d.ints_map["avg_backward_exposed_comm_time"] = ns(s.mean.exposed_comm_ms);
  return d;
}

}  // namespace ddp
