#include "atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/errors.h"

namespace ddp {

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw CheckpointError("writing " + path + ": " + what + " failed (" + err +
                          "); the previous file, if any, is untouched. Check free space and permissions.");
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
  // The rename itself is durable only once the directory is.
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace ddp
