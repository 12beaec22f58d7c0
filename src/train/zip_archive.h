// Reading the zip archives that torch.save, torch::pickle_save and
// torch::save write, trusting nothing in them: every offset and size of the
// end record, the central directory and the local headers is checked against
// the file before it is used, and every entry's bytes against its CRC-32. A
// crafted or damaged file is a CheckpointError naming the file, the entry and
// what is wrong, never a read outside the buffer. (LibTorch's reader, miniz
// built without CRC checks, loads a flipped byte in a weight silently.)
//
// PyTorch stores tensor data uncompressed, under one top-level folder named
// for the archive ("archive/data.pkl", "archive/data/0"); LibTorch deflates a
// TorchScript archive's code files, which are inflated with zlib (to at most
// the size the directory says, itself bounded by deflate's best ratio, and
// all of them together to kInflatedFloor + kInflatedPerByte x the file).
// Other methods, encrypted or multi-disk archives are refused. Zip64 records
// (files over 4 GiB) are read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/errors.h"

namespace ddp::zip {

constexpr uint64_t kInflatedFloor = uint64_t(64) << 20;
constexpr uint64_t kInflatedPerByte = 16;

struct Entry {
  std::string name;       // full name, with the archive's folder
  uint64_t data_offset;   // of its bytes in the file, past the local header
  uint64_t size;          // uncompressed
  uint64_t compressed_size;
  uint16_t method;        // 0 stored, 8 deflated
  uint32_t crc32;         // from the central directory
};

// A view of a zip held in memory: `data` must outlive the Archive.
class Archive {
 public:
  // Parses and checks the directory; CheckpointError if anything is off.
  // `what` names the file in errors.
  Archive(const char* data, size_t size, std::string what);

  const std::vector<Entry>& entries() const { return entries_; }
  // The folder every PyTorch record sits in, with its slash ("archive/"),
  // or "" when the first entry has none.
  const std::string& prefix() const { return prefix_; }
  // The entry `prefix() + record`, or nullptr.
  const Entry* find(const std::string& record) const;
  // Names of the records directly in prefix() (no further slash), e.g. "data.pkl".
  std::vector<std::string> top_level_records() const;

  // An entry's `size` bytes after checking its CRC-32 (once): in place when
  // stored, inflated (and kept) when deflated.
  const char* bytes(const Entry& e) const;
  // Checks the CRC-32 of every entry.
  void verify_all() const;

  const std::string& what() const { return what_; }

 private:
  [[noreturn]] void fail(const std::string& why) const;
  std::string inflate(const Entry& e) const;
  void read_end_record(uint64_t& count, uint64_t& cd_offset, uint64_t& cd_size, uint64_t& cd_end) const;
  // One record of the central directory as it stands (its zip64 fields
  // filled in), before its checks: `entry` has its name and CRC-32.
  struct CentralRecord {
    Entry entry;
    uint64_t flags, method, csize, usize, local, disk;
  };
  CentralRecord read_central_record(uint64_t& p, uint64_t i, uint64_t cd_stop) const;
  Entry checked_entry(CentralRecord r, uint64_t cd_offset) const;
  void check_inflated_total() const;

  const char* data_;
  size_t size_;
  std::string what_;
  std::vector<Entry> entries_;
  mutable std::vector<bool> verified_;
  mutable std::vector<std::string> inflated_;
  std::string prefix_;
};

// CRC-32 (zlib's) of n bytes, for any n.
uint32_t crc32_of(const char* p, uint64_t n);

}  // namespace ddp::zip
