// One TensorBoard event file being written: TFRecord framing (the data's
// length as a little-endian uint64, the masked CRC-32C of those 8 bytes, the
// data, the masked CRC-32C of the data), records buffered in memory and
// written out whole, in order, by write_out(). Torch- and protobuf-free.
// The file is created afresh (O_CREAT|O_EXCL|O_NOFOLLOW) in a folder opened
// without following a link, so no write lands outside the folder named.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/unique_fd.h"

namespace ddp::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes.
uint32_t crc32c(const void* data, size_t size);
// TFRecord's mask: the CRC rotated right by 15 bits, plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
// One framed record.
std::string frame_record(const std::string& data);

class RecordFile {
 public:
  // Nothing is opened yet: open() does.
  RecordFile(std::string folder, std::string name);
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  // Creates the folder (not through a link) and the file. Returns "" or
  // what failed: "<path>: <step>: <strerror>".
  std::string open();
  // Buffers one framed record.
  void append(const std::string& data);
  size_t buffered() const { return buffer_.size(); }
  // Writes the buffer out. Returns "" or what failed (as open()).
  std::string write_out();
  void close();
  std::string path() const;

 private:
  std::string folder_, name_;
  std::string buffer_;
  UniqueFd fd_;
};

}  // namespace ddp::tensorboard
