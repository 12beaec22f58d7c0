#include "train/tensorboard/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ddp::tensorboard {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// `v`'s low `bytes` bytes, little-endian, as TFRecord writes its lengths and CRCs.
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string failure(const std::string& path, const char* step, int err) {
  return path + ": " + step + ": " + std::strerror(err);
}

// The folder, made if missing, opened as a folder and never through a link.
int open_folder(const std::string& folder, std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) what = failure(folder, ec ? "create folder" : "open folder (a link is refused)", ec ? ec.value() : errno);
  return fd;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

RecordFile::RecordFile(std::string folder, std::string name) : folder_(std::move(folder)), name_(std::move(name)) {}

RecordFile::~RecordFile() { close(); }

std::string RecordFile::path() const { return (std::filesystem::path(folder_) / name_).string(); }

std::string RecordFile::open() {
  std::string what;
  const UniqueFd dir(open_folder(folder_, what));
  if (!dir) return what;
  fd_.reset(::openat(dir.get(), name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  return fd_ ? std::string() : failure(path(), "create", errno);
}

void RecordFile::append(const std::string& data) { buffer_ += frame_record(data); }

std::string RecordFile::write_out() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_.get(), buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      buffer_.erase(0, done);
      return failure(path(), "write", err);
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return "";
}

void RecordFile::close() { fd_.reset(); }

}  // namespace ddp::tensorboard
