// PyTorch's DDP logging data (model._get_ddp_logging_data()): how a
// DistributedDataParallel is configured and how it behaves, as two maps of
// the same keys PyTorch 1.13 uses, so that tools reading one read the other:
//
//   auto data = model.get_ddp_logging_data();
//   data.ints_map["avg_backward_comm_time"];   // ns, as PyTorch
//   std::ofstream("ddp_logging.json") << data.to_json();
//
// Times are nanoseconds. PyTorch samples its runtime figures (the first ten
// steps, then every hundredth); here every synchronised step counts, which
// costs a few clock reads a step. Keys of our own: bucket_cap_auto,
// bucket_cap_trials, avg_backward_exposed_comm_time and
// backward_exposed_comm_time (waiting for communication after backward),
// num_buckets, comm_hook is "registered" for any hook (a C++ callable has no
// name to report).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ddp {

struct DDPLoggingData {
  std::map<std::string, std::string> strs_map;
  std::map<std::string, int64_t> ints_map;

  // One JSON object, keys sorted: the integers as numbers, the strings as
  // strings (a key in both maps is the string's).
  std::string to_json() const;
};

}  // namespace ddp
