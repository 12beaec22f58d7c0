// Reading files written by Python's torch.save (zip format, PyTorch >= 1.6)
// and LibTorch's torch::pickle_save, without LibTorch's unpickler: that one
// turns every OrderedDict (what model.state_dict() returns) into None and
// cannot map CUDA storages to the CPU. Here every storage is read into CPU
// memory whatever device it was saved from (Python's map_location), and
// Python objects we do not know stay inert values instead of errors.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/errors.h"

namespace ddp {

namespace pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// One unpickled Python value.
struct Value {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Tensor, Global, Object };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                   // String, Bytes; Global and Object: "module.Name"
  std::vector<ValuePtr> items;                     // Tuple, List; Object: its constructor arguments
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // Dict, insertion order; Object: its state
  torch::Tensor tensor;
  // Where a tensor's storage said it lived ("cpu", "cuda:0").
  std::string saved_location;

  bool is_dict() const { return kind == Kind::Dict; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  // The value under a string key of a Dict, or nullptr.
  ValuePtr get(const std::string& key) const;
};

// Parses a whole file's bytes (a zip archive with a data.pkl). `what` names
// the file in errors. Tensors land on the CPU.
ValuePtr load(const std::vector<char>& bytes, const std::string& what);

// A whole file, as load() takes it; CheckpointError if it cannot be read.
std::vector<char> read_file(const std::string& path);

}  // namespace pickle
}  // namespace ddp
