// Model state dicts that load anywhere. The seeds' two classic errors never
// reach our users:
//   - "Missing key(s) ... Unexpected key(s)" after nn.DataParallel or DDP
//     added `module.` to every name: the prefix is stripped on load;
//   - "Attempting to deserialize object on a CUDA device" on a machine with
//     no GPU: storages are read into CPU memory and moved to the device asked for.
//
//   ddp::load_state_dict(*net, ddp::read_state_dict("model.pt"));  // Python's torch.save(model.state_dict()) too
#pragma once

#include <torch/torch.h>

#include <string>

#include "ddp/errors.h"

namespace ddp {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

// Parameters and buffers by dotted name, as PyTorch's module.state_dict().
StateDict state_dict(const torch::nn::Module& module);

// Reads the model state from any of:
//   - Python: torch.save(model.state_dict(), path), also from a
//     DataParallel/DDP-wrapped model or a GPU, and a checkpoint dict holding
//     it under "model", "state_dict", "model_state_dict" or "net";
//   - ddp::save_checkpoint's checkpoint.pt and ddp::save_state_dict's files;
//   - LibTorch: torch::save(module, path).
// Tensors end up on `device`. CheckpointError for a foreign, truncated or
// corrupt file.
StateDict read_state_dict(const std::string& path, torch::Device device = torch::kCPU);

// The same state with every leading "module." (nested wrappers: repeated) removed.
StateDict strip_module_prefix(const StateDict& state);

// Copies `state` (after strip_module_prefix) into the module's parameters
// and buffers, converting dtype and device. strict: every name must match
// both ways. A mismatch lists the missing and unexpected names and the shapes
// that differ.
void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

// A file that LibTorch's torch::save wrote (an optimizer's state, a module's
// parameters) as the archive torch::load would read, without running code:
// torch::load(obj, path) hands the file to torch::jit::load, which compiles
// the archive's code and runs its __setstate__ methods (TorchScript can
// create and overwrite files). Here only its data is read: tensors, numbers,
// strings, lists, tuples, dicts, nested modules; anything else is a
// CheckpointError. Use it for any file you did not write yourself:
//   auto archive = ddp::read_archive("optimizer.pt");
//   optimizer.load(archive);  // instead of torch::load(optimizer, "optimizer.pt")
torch::serialize::InputArchive read_archive(const std::string& path, torch::Device device = torch::kCPU);

// The module's state as a Python-loadable file: torch.load(path) gives a dict
// of tensors with no `module.` prefix. Written atomically (see checkpoint.h).
void save_state_dict(const torch::nn::Module& module, const std::string& path);

}  // namespace ddp
