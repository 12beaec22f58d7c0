// Reading files written by Python's torch.save (zip format, PyTorch >= 1.6)
// and LibTorch's torch::pickle_save, without LibTorch's unpickler: that one
// turns every OrderedDict (what model.state_dict() returns) into None and
// cannot map CUDA storages to the CPU. Here every storage is read into CPU
// memory whatever device it was saved from (Python's map_location), and
// Python objects we do not know stay inert values instead of errors.
//
// Files are untrusted: the zip is checked by zip::Archive (offsets, sizes,
// CRC-32 of every entry), containers may nest at most kMaxNesting deep (and
// never in themselves), and every tensor's storage type, key, byte size,
// offset, sizes and strides are checked, with overflow checks, before a view
// of its storage is made. Anything off is a CheckpointError naming the file.
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

// How deep containers (tuples, lists, dicts, objects) may nest. Python's
// own pickler stops near 1000 (its recursion limit); a state dict needs 3.
constexpr uint32_t kMaxNesting = 1000;

// One unpickled Python value.
struct Value {
  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  // Frees nested children with a loop, not a recursion.
  ~Value();

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
  // A storage itself (persistent_load's result), not a view of one.
  bool is_storage = false;
  // Containers: 1 + the deepest child (an empty one: 1). Leaves: 0.
  uint32_t depth = 0;
  // Already inside another container: it may no longer grow deeper.
  bool contained = false;

  bool is_dict() const { return kind == Kind::Dict; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  // The value under a string key of a Dict, or nullptr.
  ValuePtr get(const std::string& key) const;
};

// Parses a whole file's bytes (a zip archive with a data.pkl). `what` names
// the file in errors. Tensors land on the CPU (copied out of `data`).
// CheckpointError for anything malformed, whatever the bytes: this is the
// entry point for fuzzing the reader (zip, pickle and tensors together), e.g.
//   LLVMFuzzerTestOneInput(d, n): ddp::pickle::load(reinterpret_cast<const char*>(d), n, "fuzz")
// with every ddp::CheckpointError caught and anything else a finding.
ValuePtr load(const char* data, size_t size, const std::string& what);
ValuePtr load(const std::vector<char>& bytes, const std::string& what);

// A whole file, as load() takes it; CheckpointError if it cannot be read.
std::vector<char> read_file(const std::string& path);

}  // namespace pickle
}  // namespace ddp
