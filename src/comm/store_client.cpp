#include "comm/store_client.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>

namespace ddp::store_client {

namespace {

// This process's sockets: fd -> "socket:[inode]" (an fd number reused for
// another socket counts as new).
std::map<int, std::string> sockets() {
  std::map<int, std::string> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return out;
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    char target[64];
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::string(target).rfind("socket:", 0) == 0) out[static_cast<int>(fd)] = target;
  }
  ::closedir(dir);
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> connect_bounded(const std::string& host, const c10d::TCPStoreOptions& opts) {
  const auto before = sockets();
  auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(opts.timeout).count();
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  for (const auto& [fd, id] : sockets()) {
    auto it = before.find(fd);
    if (it != before.end() && it->second == id) continue;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  return store;
}

}  // namespace ddp::store_client
