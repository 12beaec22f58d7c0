// LibTorch's own archives (torch::serialize::OutputArchive: an optimizer's
// state, torch::save(module), a TorchScript module's attributes) read as data
// only. LibTorch's reader, torch::jit::load, compiles the archive's code/ and
// runs its __setstate__ methods, and TorchScript can create and overwrite
// files (torch.from_file(path, True, n)): a crafted checkpoint would run it.
//
// Here data.pkl goes through our unpickler (torch_pickle.h, its allow-list
// and bounds), code/ is only scanned for the names each class declares as
// parameters and buffers (never compiled), and constants.pkl and debug files
// are not read. The tree is rebuilt with LibTorch's OutputArchive from plain
// values (tensors, numbers, strings, lists, tuples, dicts, nested modules)
// and handed to LibTorch as its own archive: the code LibTorch compiles then
// is what its writer generated for those values, which declares no methods.
// An object of any other class (a TorchScript class, a C++ custom class) is
// a CheckpointError naming it.
#pragma once

#include <torch/torch.h>

#include <string>

#include "ddp/train/state_dict.h"

namespace ddp::module_archive {

// The archive's data as LibTorch's InputArchive, tensors on `device`.
// CheckpointError naming `what` for anything malformed or not plain data.
torch::serialize::InputArchive read(const char* data, size_t size, const std::string& what, torch::Device device);

// Every parameter and buffer, nested modules' by dotted name, on the CPU:
// what torch::save(module) wrote.
StateDict tensors(const char* data, size_t size, const std::string& what);

}  // namespace ddp::module_archive
