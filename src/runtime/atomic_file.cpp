#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/errors.h"
#include "runtime/unique_fd.h"

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

using detail::write_all;

[[noreturn]] void throw_write_failure(const std::string& path, const detail::FileWriteFailure& failure) {
  throw CheckpointError("writing " + path + ": " + failure.step + " failed (" + reason(path, failure.err) + ")");
}

}  // namespace

namespace detail {

int write_all(int fd, const char* data, size_t size) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

FileWriteFailure write_synced_temporary(const std::string& tmp, const char* data, size_t size) {
  auto fail = [&](std::string step, int err) {
    ::unlink(tmp.c_str());
    return FileWriteFailure{std::move(step), err};
  };
  // A leftover temporary (or a link planted in its place) goes first: unlink
  // removes a link, not its target. O_EXCL|O_NOFOLLOW then refuses anything
  // that appears in between.
  ::unlink(tmp.c_str());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) return fail("open " + tmp, errno);
  if (const int err = write_all(fd.get(), data, size); err != 0) return fail("write", err);
  if (::fsync(fd.get()) != 0) return fail("fsync", errno);
  if (const int err = fd.close_checked(); err != 0) return fail("close", err);
  return {};
}

FileWriteFailure rename_synced(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return {"rename", err};
  }
  // The rename itself is durable only once the directory is.
  if (const UniqueFd dir(::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dir)
    ::fsync(dir.get());
  return {};
}

}  // namespace detail

std::string write_temporary(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = path + ".tmp";
  if (const auto failure = detail::write_synced_temporary(tmp, bytes.data(), bytes.size())) throw_write_failure(path, failure);
  return tmp;
}

void replace_with_temporary(const std::string& path) {
  if (const auto failure = detail::rename_synced(path + ".tmp", path)) throw_write_failure(path, failure);
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
  const UniqueFd fd(open_append_no_follow(path));
  if (const int err = write_all(fd.get(), text.data(), text.size()); err != 0) throw_write_failure(path, {"write", err});
}

}  // namespace ddp
