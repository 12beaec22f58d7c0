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
// of its storage is made. Nothing in a file names code to run: globals are
// inert names, and only the tensor rebuilds of the allow-list are acted on.
// Memory is bounded by what the file holds: the values built from data.pkl
// may take at most kValueBytesPerPickleByte times its size in the file (plus
// kValueBytesFloor), tensor views at most what their storages hold (plus the
// same floor), and dict lookups are hashed. Anything off is a
// CheckpointError naming the file.
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
// The memory the unpickler may spend on values: a state dict's data.pkl
// takes about 25 bytes of values per byte of pickle; a crafted one would take
// about 200 (an opcode of one byte, a value of 200).
constexpr uint64_t kValueBytesPerPickleByte = 48;
constexpr uint64_t kValueBytesFloor = uint64_t(64) << 20;

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
  std::vector<ValuePtr> items;                     // Tuple, List; Object: its constructor arguments, then
                                                   // a state BUILD gave that is not a dict
  // Lists and dicts that LibTorch's pickler tagged: their TorchScript type
  // ("List[int]", "Dict[str, Tensor]").
  std::string type_tag;
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

// A whole file, as load() takes it; CheckpointError naming it if it cannot
// be read. Only a regular file is read (a FIFO, a device such as /dev/zero or
// a folder is refused without blocking), in one allocation of its size; a
// file that starts as a zip but has no zip end record in its last 64 KiB is
// refused before the rest is read (a sparse or truncated file), and of a
// file that is no zip only its first 16 bytes are read (all load() needs to
// say what it is).
std::vector<char> read_file(const std::string& path);

}  // namespace pickle
}  // namespace ddp
