// Whether a path (or an open file) is a regular file, for the readers of
// outside files: a FIFO would block them, /dev/zero would never end, a folder
// would fail obscurely. Checked before anything reads it.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace ddp {

// "" when `st` (of stat or fstat) is a regular file's, else what it is, in
// words for an error message ("a FIFO, not a regular file").
inline std::string why_not_regular(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a folder, not a file";
  if (S_ISFIFO(st.st_mode)) return "a FIFO, not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device, not a regular file";
  if (S_ISSOCK(st.st_mode)) return "a socket, not a regular file";
  return "not a regular file";
}

// "" when `path` is a regular file (its size then in *size), else why not
// ("a FIFO, not a regular file", "no such file").
inline std::string why_not_a_regular_file(const std::string& path, uint64_t* size = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? "no such file" : std::strerror(errno);
  std::string why = why_not_regular(st);
  if (why.empty() && size) *size = static_cast<uint64_t>(st.st_size);
  return why;
}

}  // namespace ddp
