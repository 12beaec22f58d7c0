#include "ddp/train/state_dict.h"

#include "runtime/atomic_file.h"
#include "module_archive.h"
#include "state_dict_io.h"
#include "zip_archive.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include <torch/csrc/jit/serialization/pickle.h>

namespace ddp {

namespace {

// torch::save(module) writes a TorchScript-style archive: constants.pkl
// beside data.pkl at its top level. Judged from the zip's directory, not by
// searching the bytes: our checkpoint.pt holds an optimizer archive (with a
// constants.pkl of its own) as a tensor's bytes.
bool is_libtorch_module_archive(const std::vector<char>& bytes, const std::string& path) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "PK\x03\x04", 4) != 0) return false;
  const zip::Archive zip(bytes.data(), bytes.size(), path);
  const auto records = zip.top_level_records();
  return std::find(records.begin(), records.end(), "constants.pkl") != records.end();
}

std::string shape(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& p : module.named_parameters(true)) out.insert(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) out.insert(b.key(), b.value());
  return out;
}

namespace detail {

bool to_state_dict(const pickle::ValuePtr& v, StateDict& out) {
  if (!v || !v->is_dict()) return false;
  StateDict sd;
  for (const auto& [k, t] : v->dict) {
    if (k->kind != pickle::Value::Kind::String || !t->is_tensor()) return false;
    sd.insert(k->s, t->tensor);
  }
  out = std::move(sd);
  return true;
}

c10::impl::GenericDict to_ivalue(const StateDict& state) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state) d.insert(item.key(), item.value().detach().cpu().contiguous());
  return d;
}

}  // namespace detail

StateDict read_state_dict(const std::string& path, torch::Device device) {
  const auto bytes = pickle::read_file(path);
  StateDict sd;
  if (is_libtorch_module_archive(bytes, path)) {
    // LibTorch's torch::save(module, path), read as data only: LibTorch's
    // own reader would compile and run the archive's code.
    sd = module_archive::tensors(bytes.data(), bytes.size(), path);
  } else {
    auto root = pickle::load(bytes, path);
    if (!detail::to_state_dict(root, sd)) {
      bool found = false;
      for (const char* key : {"model", "state_dict", "model_state_dict", "net", "module"})
        if (root->is_dict() && detail::to_state_dict(root->get(key), sd)) {
          found = true;
          break;
        }
      if (!found)
        throw CheckpointError(path + ": holds no model state (expected a dict of tensors, or a checkpoint dict "
                                     "with one under \"model\" or \"state_dict\")");
    }
  }
  StateDict out;
  for (const auto& item : sd) out.insert(item.key(), item.value().to(device));
  return out;
}

StateDict strip_module_prefix(const StateDict& state) {
  static const std::string prefix = "module.";
  StateDict out;
  for (const auto& item : state) {
    std::string name = item.key();
    while (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
    if (out.contains(name))
      throw CheckpointError("state dict: '" + item.key() + "' and another entry both become '" + name +
                            "' without their module. prefixes");
    out.insert(name, item.value());
  }
  return out;
}

namespace detail {

std::string misfit_message(std::string msg, const std::vector<std::string>& missing,
                           const std::vector<std::string>& unexpected, const std::vector<std::string>& mismatched) {
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg += std::string("\n  ") + what + ":";
    for (size_t i = 0; i < names.size() && i < 10; ++i) msg += " " + names[i];
    if (names.size() > 10) msg += " ... (" + std::to_string(names.size()) + " in all)";
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("shape differs", mismatched);
  return msg + "\n  Is it the checkpoint of another model? (module. prefixes are already stripped.)";
}

}  // namespace detail

void load_state_dict(torch::nn::Module& module, const StateDict& state_in, bool strict) {
  const StateDict state = strip_module_prefix(state_in);
  auto targets = state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& t : targets) {
    const torch::Tensor* src = state.find(t.key());
    if (!src) {
      missing.push_back(t.key());
    } else if (src->sizes() != t.value().sizes()) {
      mismatched.push_back(t.key() + " (file " + shape(*src) + ", model " + shape(t.value()) + ")");
    }
  }
  for (const auto& s : state)
    if (!targets.contains(s.key())) unexpected.push_back(s.key());
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty())))
    throw CheckpointError(detail::misfit_message("load_state_dict: the state does not fit the model.", missing,
                                                 unexpected, mismatched));
  torch::NoGradGuard no_grad;
  for (auto& t : targets)
    if (const torch::Tensor* src = state.find(t.key())) t.value().copy_(*src);
}

torch::serialize::InputArchive read_archive(const std::string& path, torch::Device device) {
  const auto bytes = pickle::read_file(path);
  return module_archive::read(bytes.data(), bytes.size(), path, device);
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  write_atomically(path, torch::pickle_save(detail::to_ivalue(state_dict(module))));
}

}  // namespace ddp
