#include "comm/store/store_deadline.h"

#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace ddp::store_deadline {

namespace {

// How often the helper thread looks at the clock and `stop`.
constexpr auto kLook = std::chrono::milliseconds(50);

}  // namespace

Sockets sockets_now() { return fds_now("socket:"); }

Sockets fds_now(const std::string& kind) {
  Sockets out;
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
    if (std::string(target).rfind(kind, 0) == 0) out[static_cast<int>(fd)] = target;
  }
  ::closedir(dir);
  return out;
}

std::vector<int> opened_since(const Sockets& before, const std::string& kind) {
  std::vector<int> out;
  for (const auto& [fd, id] : fds_now(kind)) {
    auto it = before.find(fd);
    if (it == before.end() || it->second != id) out.push_back(fd);
  }
  return out;
}

Deadline::Deadline(Clock::time_point at, std::vector<int> sockets, std::function<bool()> stop)
    : at_(at), sockets_(std::move(sockets)), stop_(std::move(stop)), before_(sockets_now()) {
  thread_ = std::thread([this] { watch(); });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Ended Deadline::ended() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ended_;
}

void Deadline::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!done_) {
    if (ended_ == Ended::No) {
      if (Clock::now() >= at_) {
        ended_ = Ended::Deadline;
      } else if (stop_ && stop_()) {
        ended_ = Ended::Stop;
      }
    }
    // Once ended, every pass: a constructor that reconnects gets its new
    // socket shut down too.
    if (ended_ != Ended::No) shut_down();
    cv_.wait_for(lock, kLook, [this] { return done_; });
  }
}

void Deadline::shut_down() {
  // Wakes a recv() or send() blocked on the socket, in any thread; the fd
  // stays open (and c10d's) until the store closes it.
  if (!shut_given_) {
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    shut_given_ = true;
  }
  for (const auto& socket : sockets_now()) {
    auto it = before_.find(socket.first);
    if ((it != before_.end() && it->second == socket.second) || shut_.count(socket)) continue;
    ::shutdown(socket.first, SHUT_RDWR);
    shut_.insert(socket);
  }
}

}  // namespace ddp::store_deadline
