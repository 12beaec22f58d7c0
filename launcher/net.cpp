#include "net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include "errors.h"
#include "runtime/reserved_port.h"
#include "fd.h"
#include "wait.h"

namespace ddprun {
namespace {

struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) ::freeaddrinfo(head);
  }
};

int resolve(const std::string& host, uint16_t port, int socktype, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return ::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &out.head);
}

}  // namespace

uint16_t free_port() {
  try {
    return ddp::detail::reserve_port();
  } catch (const std::system_error& e) {
    throw LaunchError(std::string("cannot find a free port: ") + e.what());
  }
}

std::string port_unavailable_reason(uint16_t port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return std::strerror(errno);
  // SO_REUSEADDR like TCPStore: a port in TIME_WAIT from a previous run is
  // usable, only a live listener makes the port unavailable.
  int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.get(), 1) != 0)
    return std::strerror(errno);
  return "";
}

bool is_local_host(const std::string& host) {
  AddrInfo ai;
  if (resolve(host, 0, SOCK_STREAM, ai) != 0) return false;
  for (addrinfo* p = ai.head; p; p = p->ai_next) {
    UniqueFd s(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, 0));
    if (!s) continue;
    // Binding to an address succeeds only if the address belongs to us.
    if (::bind(s.get(), p->ai_addr, p->ai_addrlen) == 0) return true;
  }
  return false;
}

std::string local_address_toward(const std::string& host, uint16_t port) {
  AddrInfo ai;
  if (resolve(host, port, SOCK_DGRAM, ai) != 0) return "";
  for (addrinfo* p = ai.head; p; p = p->ai_next) {
    UniqueFd s(::socket(p->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s) continue;
    // connect() on UDP sends nothing; it only asks the kernel for a route.
    if (::connect(s.get(), p->ai_addr, p->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (local.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, buf, sizeof buf);
    else
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, buf, sizeof buf);
    return buf;
  }
  return "";
}

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

bool accepts_connections(const std::string& host, uint16_t port, std::string& last_error) {
  AddrInfo ai;
  int rc = resolve(host, port, SOCK_STREAM, ai);
  if (rc != 0) {
    last_error = std::string("cannot resolve '") + host + "': " + ::gai_strerror(rc);
    return false;
  }
  for (addrinfo* p = ai.head; p; p = p->ai_next) {
    UniqueFd s(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s) continue;
    int r = ::connect(s.get(), p->ai_addr, p->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd pf{s.get(), POLLOUT, 0};
      if (::poll(&pf, 1, 1000) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        r = err == 0 ? 0 : -1;
        errno = err;
      } else {
        r = -1;
        errno = ETIMEDOUT;
      }
    }
    if (r == 0) return true;
    last_error = std::strerror(errno);
  }
  return false;
}


bool wait_until_listening(const std::string& host, uint16_t port, Clock::time_point deadline,
                          const std::function<void()>& tick, std::string& last_error) {
  return wait_until(deadline, tick, std::chrono::milliseconds(200),
                    [&] { return accepts_connections(host, port, last_error); });
}

}  // namespace ddprun
