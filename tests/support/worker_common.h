// What the rank programs of the multi-process DDP tests share: the check
// that fails a rank, the small models and data, comparisons against a
// single-process reference, and the scenarios that live in other files.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/ddp.h"

namespace ddp::testing {

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define EXPECT_OR_FAIL(cond, msg)                                                           \
  do {                                                                                      \
    if (!(cond)) throw Fail(std::string("check failed: ") + #cond + ": " + std::string(msg)); \
  } while (0)

// Linear layers, optionally with a float and a double part, a BatchNorm in
// front, and an extra layer that only some ranks use.
struct NetImpl : torch::nn::Module {
  NetImpl(bool mixed, bool batchnorm, int out = 4, bool with_extra = false, bool reversed = false)
      : mixed(mixed), use_bn(batchnorm) {
    if (use_bn) bn = register_module("bn", torch::nn::BatchNorm1d(8));
    if (reversed) {
      // Registered in the order gradients become ready: the initial bucket
      // guess (reverse registration) is wrong, so the rebuild must reorder.
      l3 = register_module("l3", torch::nn::Linear(32, out));
      l2 = register_module("l2", torch::nn::Linear(32, 32));
      l1 = register_module("l1", torch::nn::Linear(8, 32));
    } else {
      l1 = register_module("l1", torch::nn::Linear(8, 32));
      l2 = register_module("l2", torch::nn::Linear(32, 32));
      l3 = register_module("l3", torch::nn::Linear(32, out));
    }
    if (with_extra) extra = register_module("extra", torch::nn::Linear(8, out));
    if (mixed) {
      l1->to(torch::kFloat);
      l2->to(torch::kDouble);
      l3->to(torch::kDouble);
      if (extra) extra->to(torch::kDouble);
    } else {
      to(torch::kDouble);
    }
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    if (use_bn) x = bn(x);
    auto h = torch::relu(l1(mixed ? x.to(torch::kFloat) : x));
    h = torch::relu(l2(h.to(torch::kDouble)));
    auto y = l3(h);
    if (use_extra) y = y + extra(x.to(torch::kDouble));
    return y;
  }
  bool mixed, use_bn;
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, extra{nullptr};
};
TORCH_MODULE(Net);

// The global batch of step `step` (the same on every rank), and this rank's rows.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int rows) {
  torch::manual_seed(1000 + step);
  return {torch::randn({rows, 8}, torch::kDouble), torch::randn({rows, 4}, torch::kDouble)};
}

inline void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto src = from.named_parameters(true);
  for (auto& p : to.named_parameters(true)) p.value().copy_(src[p.key()]);
  auto bsrc = from.named_buffers(true);
  for (auto& b : to.named_buffers(true)) b.value().copy_(bsrc[b.key()]);
}

inline void expect_same_across_ranks(ddp::ProcessGroup& pg, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  std::vector<torch::Tensor> flat;
  for (auto& t : tensors) flat.push_back(t.detach().to(torch::kDouble).reshape(-1));
  auto mine = torch::cat(flat);
  auto all = pg.allgather(mine);
  for (int r = 0; r < pg.size(); ++r)
    EXPECT_OR_FAIL(torch::equal(all[r], all[0]), what + " differ between rank " + std::to_string(r) + " and rank 0");
}

inline void expect_grads_close(torch::nn::Module& ddp_model, torch::nn::Module& ref, const std::string& when,
                        bool with_extra = false) {
  auto ref_params = ref.named_parameters(true);
  for (auto& p : ddp_model.named_parameters(true)) {
    if (!with_extra && p.key().rfind("extra", 0) == 0) continue;
    auto g = p.value().grad();
    auto r = ref_params[p.key()].grad();
    EXPECT_OR_FAIL(g.defined() && r.defined(), when + ": gradient of " + p.key() + " is missing");
    auto diff = (g.to(torch::kDouble) - r.to(torch::kDouble)).abs().max().item<double>();
    // Summation order only: a float32 gradient summed over the ranks (in the
    // backend's order) against one batch's sum differs by several ulps, and
    // by ulps of the largest element where terms cancel.
    const bool single = g.scalar_type() == torch::kFloat;
    const double scale = r.abs().max().item<double>();
    bool close = torch::allclose(g.to(torch::kDouble), r.to(torch::kDouble), single ? 1e-5 : 1e-6,
                                 single ? 1e-6 * scale : 1e-9);
    EXPECT_OR_FAIL(close, when + ": gradient of " + p.key() + " differs from the single-process gradient by " +
                              std::to_string(diff));
  }
}

// The small buckets of parity_common.make_model: PyTorch's module-level
// first-bucket size (dist._DEFAULT_FIRST_BUCKET_BYTES) and bucket_cap_mb.
// PyTorch 2.x keeps that first size for its default cap only, so against
// LibTorch 2.x the first bucket is left to the library's same rule
// (ddp::first_bucket_mb_in_effect).
inline ddp::DDPOptions& python_small_buckets(ddp::DDPOptions& options, double first_bytes, double cap_bytes) {
  options.bucket_cap_mb(cap_bytes / (1 << 20));
#if TORCH_VERSION_MAJOR < 2
  options.first_bucket_mb(first_bytes / (1 << 20));
#else
  (void)first_bytes;
#endif
  return options;
}

// Options with tiny buckets: the first holds one small tensor, a 16x16
// double weight (2 KiB) is alone in its bucket.
inline ddp::DDPOptions tiny_buckets() { return ddp::DDPOptions().first_bucket_mb(0.0001).bucket_cap_mb(0.001); }

// Each tensor once, in the order DistributedDataParallel (and Python's
// named_parameters()) lists them.
inline std::vector<std::pair<std::string, torch::Tensor>> unique_parameters(const torch::nn::Module& m) {
  std::set<const void*> seen;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : m.named_parameters(true))
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  return out;
}

// The PyTorch-parity scenarios (parity, join_parity, powersgd_parity) and
// their scripts compare bitwise, so both sides build the same parameters, the
// same bytes and the same files: these are parity_common.py's init,
// state_bytes and write_bytes; change both together.

// Parameter i (each tensor once, in named_parameters() order), element k:
// weights weight_scale(p) * sin(0.7 k + i), biases 0.01 cos(k + i), computed
// in double and rounded to float once.
inline void init_parity_parameters(
    torch::nn::Module& net,
    const std::function<double(const torch::Tensor&)>& weight_scale = [](const torch::Tensor&) { return 0.3; }) {
  torch::NoGradGuard g;
  int layer = 0;
  for (auto& [key, p] : unique_parameters(net)) {
    auto k = torch::arange(p.numel(), torch::kDouble);
    auto v = key.find("weight") != std::string::npos ? torch::sin(0.7 * k + layer) * weight_scale(p)
                                                     : 0.01 * torch::cos(k + layer);
    p.copy_(v.reshape(p.sizes()).to(torch::kFloat));
    ++layer;
  }
}

// The parameters (each once), then the floating-point buffers, as raw float32.
inline std::string parity_state_bytes(torch::nn::Module& net) {
  std::string bytes;
  auto append = [&](const torch::Tensor& t) {
    auto c = t.detach().to(torch::kFloat).contiguous();
    bytes.append(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  };
  for (auto& [key, p] : unique_parameters(net)) append(p);
  for (auto& b : net.buffers(true))
    if (b.is_floating_point()) append(b);
  return bytes;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// "a,b,c" as {"a", "b", "c"}: the --cases and --batches flags.
inline std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream s(list);
  for (std::string item; std::getline(s, item, ',');) out.push_back(item);
  return out;
}

using Flags = std::map<std::string, std::string>;

// ddp_worker's scenarios by name: each scenario file adds its own as the
// program starts (a namespace-scope `const AddScenarios`), and ddp_worker
// runs the one argv names. A build compiles the files it needs (the
// sanitized build: ddp_worker.cpp's own scenarios only).
using Scenario = std::function<int(std::shared_ptr<ProcessGroup>, const Flags&)>;

inline std::map<std::string, Scenario>& scenario_table() {
  static std::map<std::string, Scenario> table;
  return table;
}

struct AddScenarios {
  AddScenarios(std::initializer_list<std::pair<const char*, Scenario>> scenarios) {
    for (const auto& [name, run] : scenarios)
      if (!scenario_table().emplace(name, run).second) throw std::logic_error(std::string("scenario ") + name + " twice");
  }
};

// parity_scenario.cpp's data, shared with the other PyTorch-parity scenarios:
// step `step`'s global batch of `rows` (x: 6 features, y: 3 targets, float).
std::pair<torch::Tensor, torch::Tensor> parity_batch(int step, int rows);

}  // namespace ddp::testing
