// Serving a TCPStore on one address (store_bind.h says why and when).
//
// The substitution (LibTorch 1.13 to 2.7). c10d's server socket code asks
// getaddrinfo(NULL, port, AI_PASSIVE) for the wildcard addresses, makes a
// socket for the first one (IPv6 "::", dual-stack; else IPv4 "0.0.0.0"),
// binds and listens, all in the thread that constructs the TCPStore. We bind
// a socket to the wanted address first; then, while that thread constructs
// the store, this file's bind() answers c10d's bind of a wildcard address on
// that port by putting our socket under c10d's file descriptor number
// (dup3), so c10d listens on, accepts from and closes our socket, whatever
// its family. Every other bind() call, on every thread, goes straight to the
// C library's. The interposed bind() is in bind_substitution.cpp, found before
// libc's (the executable, or libddp linked before libc); when it is not, c10d
// binds the wildcard itself and the store says so in its notice.
#include "comm/store/store_bind.h"

#include "comm/store/bind_substitution.h"

#include "comm/c10d_compat.h"
#include "runtime/unique_fd.h"

// c10d_compat.h decides whether this LibTorch needs the substitution; the
// build, which compiles the interposed bind() into the program, must agree.
#if defined(DDP_STORE_BIND_SUBSTITUTION) != defined(DDP_INTERPOSE_BIND)
#error "src/CMakeLists.txt's DDP_INTERPOSE_BIND disagrees with c10d_compat.h's DDP_STORE_BIND_SUBSTITUTION"
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

namespace ddp::store_bind {
namespace {

using Fd = UniqueFd;

struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) ::freeaddrinfo(head);
  }
};

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    auto* s6 = &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(s6) || (IN6_IS_ADDR_V4MAPPED(s6) && s6->s6_addr[12] == 127);
  }
  return false;
}

std::string numeric(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(a, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return a->sa_family == AF_INET6 ? "[" + std::string(host) + "]" : host;
}

uint16_t bound_port(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return 0;
  return ntohs(s.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&s)->sin_port
                                      : reinterpret_cast<sockaddr_in6*>(&s)->sin6_port);
}

std::string strip_brackets(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

bool is_numeric_address(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return ::inet_pton(AF_INET, host.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

// A socket bound (not listening) to `a`, with TCPStore's SO_REUSEADDR, or
// the bind's errno.
Fd bind_to(const sockaddr* a, socklen_t len, int& err) {
  Fd s(::socket(a->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) {
    err = errno;
    return Fd();
  }
  int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a->sa_family == AF_INET6) {
    int zero = 0;  // the wildcard "::" also takes IPv4, as c10d's does
    ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (real_bind(s.get(), a, len) != 0) {
    err = errno;
    return Fd();
  }
  return s;
}

Fd bind_wildcard(uint16_t port, int& err) {
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_any;
  a6.sin6_port = htons(port);
  Fd s = bind_to(reinterpret_cast<sockaddr*>(&a6), sizeof a6, err);
  if (s || err == EADDRINUSE) return s;
  sockaddr_in a4{};
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  a4.sin_port = htons(port);
  return bind_to(reinterpret_cast<sockaddr*>(&a4), sizeof a4, err);
}

// Whether the connection `client` made arrived at `listener`: a token sent
// on it must come out of a connection accepted there. (A proxy or firewall
// that answers every connect on the path would pass a bare connect.)
bool arrived_here(int client, int listener, std::chrono::steady_clock::time_point deadline) {
  unsigned char token[16];
  const auto salt = std::chrono::steady_clock::now().time_since_epoch().count() ^ ::getpid();
  for (size_t i = 0; i < sizeof token; ++i) token[i] = static_cast<unsigned char>((salt >> (i % 8 * 8)) + i * 37);
  if (::send(client, token, sizeof token, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof token)) return false;
  auto left = [&] {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<long long>(0, ms.count()));
  };
  pollfd lp{listener, POLLIN, 0};
  while (::poll(&lp, 1, left()) == 1) {
    Fd conn(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn) return false;
    unsigned char got[sizeof token];
    size_t n = 0;
    pollfd cp{conn.get(), POLLIN, 0};
    while (n < sizeof got && ::poll(&cp, 1, left()) == 1) {
      ssize_t r = ::recv(conn.get(), got + n, sizeof got - n, 0);
      if (r <= 0) break;
      n += static_cast<size_t>(r);
    }
    if (n == sizeof got && std::memcmp(got, token, sizeof got) == 0) return true;
  }
  return false;
}

// Whether this machine reaches its own `listener` at host:port, through one
// of the host's addresses, within `budget`.
bool reaches(const addrinfo* list, int listener, std::chrono::milliseconds budget, std::string& why) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (const addrinfo* p = list; p; p = p->ai_next) {
    Fd s(::socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s) continue;
    int r = ::connect(s.get(), p->ai_addr, p->ai_addrlen);
    int err = r == 0 ? 0 : errno;
    if (r != 0 && err == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd pf{s.get(), POLLOUT, 0};
      if (::poll(&pf, 1, static_cast<int>(std::max<long long>(0, left.count()))) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    const std::string where = numeric(p->ai_addr, p->ai_addrlen);
    if (err == 0) {
      if (arrived_here(s.get(), listener, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(2))))
        return true;
      why = where + ": something else answers there, not this host";
      continue;
    }
    why = where + ": " +
          (err == ETIMEDOUT ? "no answer within " + std::to_string(budget.count() / 1000) + " s" : std::strerror(err));
  }
  return false;
}

#ifdef DDP_STORE_BIND_SUBSTITUTION
// Restores the thread's substitution slot on every path.
class SubstitutionScope {
 public:
  explicit SubstitutionScope(Substitution& s) { set_thread_substitution(&s); }
  ~SubstitutionScope() { set_thread_substitution(nullptr); }
  SubstitutionScope(const SubstitutionScope&) = delete;
  SubstitutionScope& operator=(const SubstitutionScope&) = delete;
};
#endif

// The server on every interface, as c10d makes it itself.
ServedStore serve_everywhere(const std::string& host, const c10d::TCPStoreOptions& opts, std::string notice) {
  ServedStore out;
  out.store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  out.listening_on = "*:" + std::to_string(out.store->getPort());
  out.notice = std::move(notice);
  return out;
}

// The first of the host's addresses that binds, and where; an address in
// use, or another failure, is a ListenError. `not_local`: none is this
// machine's.
struct Bound {
  Fd listener;
  std::string listening_on;
  bool not_local = false;
};

Bound bind_first(const addrinfo* head, const std::string& port_text) {
  Bound out;
  bool in_use = false;
  std::string other;
  for (const addrinfo* p = head; p && !out.listener; p = p->ai_next) {
    int err = 0;
    out.listener = bind_to(p->ai_addr, p->ai_addrlen, err);
    if (out.listener) {
      out.listening_on = numeric(p->ai_addr, p->ai_addrlen);
    } else if (err == EADDRINUSE) {
      in_use = true;
      out.listening_on = numeric(p->ai_addr, p->ai_addrlen);
    } else if (err == EADDRNOTAVAIL) {
      out.not_local = true;
    } else {
      other = numeric(p->ai_addr, p->ai_addrlen) + ": " + std::strerror(err);
    }
  }
  if (in_use)
    throw ListenError(ListenError::Kind::InUse, "port " + port_text + " on " + out.listening_on +
                                                    " is already in use (another job's store, or an earlier run "
                                                    "that has not exited)");
  if (!out.listener && !other.empty())
    throw ListenError(ListenError::Kind::Other, "cannot bind " + other);
  return out;
}

// Not one of this machine's addresses: a NAT or a container's port
// mapping may still lead it here. Listen everywhere if this machine
// reaches its own listener through that address, as the others must.
ServedStore serve_through_mapping(const addrinfo* head, const std::string& host, const std::string& host_in,
                                  c10d::TCPStoreOptions opts) {
  const std::string port_text = std::to_string(opts.port);
  int err = 0;
  Fd probe = bind_wildcard(opts.port, err);
  if (!probe || ::listen(probe.get(), 16) != 0)
    throw ListenError(err == EADDRINUSE ? ListenError::Kind::InUse : ListenError::Kind::Other,
                      "port " + port_text + " on every interface: " + std::strerror(err ? err : errno));
  std::string why;
  const auto budget = std::min<std::chrono::milliseconds>(opts.timeout, std::chrono::seconds(10));
  if (!reaches(head, probe.get(), budget, why))
    throw ListenError(ListenError::Kind::NotLocal, "'" + host + "' is not an address of this host, and this host " +
                                                       "does not reach it on port " + port_text + " either (" +
                                                       why + ")");
  const uint16_t port = bound_port(probe.get());
  probe = Fd();  // c10d binds the wildcard itself
  opts.port = port;
  return serve_everywhere(host_in, opts,
                          "'" + host + "' is not an address of this host, but leads here (NAT or a port "
                          "mapping?); the store listens on every interface");
}

// The store's server on `listener`, bound to `listening_on`.
ServedStore serve_on(Fd listener, const std::string& listening_on, const std::string& host_in,
                     c10d::TCPStoreOptions opts) {
  if (opts.port == 0) opts.port = bound_port(listener.get());
  ServedStore out;
  out.listening_on = listening_on + ":" + std::to_string(opts.port);
#ifdef DDP_STORE_BIND_SUBSTITUTION
  Substitution sub;
  sub.listener = listener.get();
  sub.port = opts.port;
  {
    SubstitutionScope scope(sub);
    out.store = c10::make_intrusive<c10d::TCPStore>(host_in, opts);
  }
  if (!sub.done) {
    out.listening_on = "*:" + std::to_string(opts.port);
    out.notice = "the store listens on every interface: c10d's bind() could not be directed to " + listening_on +
                 " (libddp's bind() is not found before the C library's in this process)";
  }
#else
  if (::listen(listener.get(), SOMAXCONN) != 0)
    throw ListenError(ListenError::Kind::Other, "cannot listen on " + out.listening_on + ": " + std::strerror(errno));
  // The store's server owns the socket from here (a throw before it took
  // it over leaks one descriptor; a close here could close a reused one).
  compat::set_master_listen_fd(opts, listener.release());
  out.store = c10::make_intrusive<c10d::TCPStore>(host_in, opts);
#endif
  return out;
}

}  // namespace

ServedStore serve_tcp_store(const std::string& host_in, c10d::TCPStoreOptions opts) {
  const std::string host = strip_brackets(host_in);
  const std::string port_text = std::to_string(opts.port);
  AddrInfo ai;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &ai.head); rc != 0)
    throw ListenError(ListenError::Kind::Unresolved,
                      "'" + host + "' does not resolve on this host (" + ::gai_strerror(rc) + ")");

  // A name (not "localhost") that resolves to loopback here names this
  // machine for the others, who resolve it elsewhere (DNS): Debian's
  // /etc/hosts maps the machine's own name to 127.0.1.1.
  if (!is_numeric_address(host) && host != "localhost" && is_loopback(ai.head->ai_addr))
    return serve_everywhere(host_in, opts,
                            "'" + host + "' resolves to " + numeric(ai.head->ai_addr, ai.head->ai_addrlen) +
                                " (loopback) on this host only; the store listens on every interface so that the "
                                "other hosts reach it (set the address itself to listen on it alone)");

  Bound bound = bind_first(ai.head, port_text);
  if (!bound.listener && bound.not_local) return serve_through_mapping(ai.head, host, host_in, opts);
  return serve_on(std::move(bound.listener), bound.listening_on, host_in, opts);
}

}  // namespace ddp::store_bind
