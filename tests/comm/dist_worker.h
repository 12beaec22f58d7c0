// What dist_worker's two files share: the group's device, tensors on it, an
// object shown as pytorch_dist_parity.py's show() does, and the modes that
// dist_worker_refusals.cpp runs.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace dist_worker {

extern torch::Device g_device;  // the group's

at::Tensor zeros(std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat);
std::string show(const c10::IValue& v);

void errors();     // `dist_worker errors`
void monitored();  // `dist_worker monitored`
void teardown();   // `dist_worker teardown`

}  // namespace dist_worker
