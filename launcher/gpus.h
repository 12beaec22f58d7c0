// Counting the GPUs a worker could use, at run time and without linking
// CUDA: the launcher must start on machines with no driver at all.
#pragma once

#include <optional>
#include <string>

namespace ddprun {

struct GpuCount {
  int count = 0;
  std::string how;  // which library answered, or why none did (for messages)
};

// Visible GPUs: libcuda.so.1's cuDeviceGetCount (which applies
// CUDA_VISIBLE_DEVICES itself), else NVML's device count filtered through
// CUDA_VISIBLE_DEVICES by count_visible(), else 0.
GpuCount count_visible_gpus();

// CUDA's reading of CUDA_VISIBLE_DEVICES for a machine with `physical`
// devices: entries are indices or GPU-/MIG- UUIDs; the list ends at the first
// invalid or repeated entry (so "" and "-1" hide every device).
int count_visible(const std::string& cuda_visible_devices, int physical);

// CPUs this process may run on (sched_getaffinity, so taskset/cpusets count).
int usable_cpus();

}  // namespace ddprun
