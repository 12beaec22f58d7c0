// Whether a path names a regular file, for the readers of outside files: a
// FIFO would block them, /dev/zero would never end, a folder would fail
// obscurely. Checked with stat before anything opens the path.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace ddp {

// "" when `path` is a regular file (its size then in *size), else why not,
// in words for an error message ("a FIFO", "no such file").
inline std::string why_not_a_regular_file(const std::string& path, uint64_t* size = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? "no such file" : std::strerror(errno);
  if (S_ISREG(st.st_mode)) {
    if (size) *size = static_cast<uint64_t>(st.st_size);
    return "";
  }
  if (S_ISDIR(st.st_mode)) return "a folder, not a file";
  if (S_ISFIFO(st.st_mode)) return "a FIFO, not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device, not a regular file";
  if (S_ISSOCK(st.st_mode)) return "a socket, not a regular file";
  return "not a regular file";
}

}  // namespace ddp
