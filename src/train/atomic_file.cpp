#include "atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/errors.h"

namespace ddp {

namespace {

std::string folder_of(const std::string& path) {
  const std::filesystem::path target(path);
  return target.has_parent_path() ? target.parent_path().string() : ".";
}

// Why a write into `path`'s folder failed, in words a user can act on.
std::string reason(const std::string& path, int err) {
  std::error_code ec;
  if (err == ENOENT && !std::filesystem::is_directory(folder_of(path), ec))
    return "its folder " + folder_of(path) + " no longer exists (removed or renamed while the run wrote to it); "
           "nothing was written";
  if (err == ELOOP || err == EEXIST)
    return std::string(std::strerror(err)) + ": a file or symbolic link is in the way, and files of a run folder "
           "are never written through links; remove it if it is not yours";
  return std::string(std::strerror(err)) + "; the previous file, if any, is untouched. Check free space and permissions";
}

void write_all(int fd, const char* data, size_t size, const std::string& path, const std::string& tmp) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      if (!tmp.empty()) ::unlink(tmp.c_str());
      throw CheckpointError("writing " + path + ": write failed (" + reason(path, err) + ")");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string write_temporary(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError("writing " + path + ": " + what + " failed (" + reason(path, err) + ")");
  };
  // A leftover temporary (or a link planted in its place) goes first: unlink
  // removes a link, not its target. O_EXCL|O_NOFOLLOW then refuses anything
  // that appears in between.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + tmp);
  write_all(fd, bytes.data(), bytes.size(), path, tmp);
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  return tmp;
}

void replace_with_temporary(const std::string& path) {
  const std::string tmp = path + ".tmp";
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError("writing " + path + ": rename failed (" + reason(path, err) + ")");
  }
  // The rename itself is durable only once the directory is.
  const int dfd = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  write_temporary(path, bytes);
  replace_with_temporary(path);
}

int open_append_no_follow(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw CheckpointError("cannot write " + path + " (" + reason(path, err) + ")");
  }
  return fd;
}

void append_no_follow(const std::string& path, const std::string& text) {
  const int fd = open_append_no_follow(path);
  write_all(fd, text.data(), text.size(), path, "");
  ::close(fd);
}

}  // namespace ddp
