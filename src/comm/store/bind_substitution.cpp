// The interposed bind() and this thread's substitution (bind_substitution.h).
// The symbol replaces the C library's when it is found first: in the
// executable, or in libddp linked before libc. Built against LibTorch 1.13 to
// 2.7 only (DDP_INTERPOSE_BIND, src/CMakeLists.txt); from 2.8 on, c10d takes
// a bound socket and bind() stays the C library's.
#include "comm/store/bind_substitution.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>

namespace ddp::store_bind {
namespace {

using BindFn = int (*)(int, const sockaddr*, socklen_t);

BindFn libc_bind() {
  static const BindFn f = reinterpret_cast<BindFn>(::dlsym(RTLD_NEXT, "bind"));
  return f;
}

thread_local Substitution* t_substitution = nullptr;

#ifdef DDP_INTERPOSE_BIND
bool is_wildcard(const sockaddr* a, socklen_t len, uint16_t port) {
  if (!a) return false;
  if (a->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    auto* in = reinterpret_cast<const sockaddr_in*>(a);
    return in->sin_addr.s_addr == htonl(INADDR_ANY) && ntohs(in->sin_port) == port;
  }
  if (a->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
    return IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) && ntohs(in6->sin6_port) == port;
  }
  return false;
}
#endif

}  // namespace

void set_thread_substitution(Substitution* s) { t_substitution = s; }

int real_bind(int fd, const sockaddr* addr, socklen_t len) {
  BindFn f = libc_bind();
  if (!f) {
    errno = ENOSYS;
    return -1;
  }
  return f(fd, addr, len);
}

}  // namespace ddp::store_bind

#ifdef DDP_INTERPOSE_BIND
// Not in any namespace: it replaces the C library's for this process.
extern "C" int bind(int fd, const sockaddr* addr, socklen_t len) noexcept {
  ddp::store_bind::Substitution* s = ddp::store_bind::t_substitution;
  if (s && !s->done && ddp::store_bind::is_wildcard(addr, len, s->port)) {
    // Our socket under c10d's descriptor number; c10d's own socket closes.
    if (::dup3(s->listener, fd, O_CLOEXEC) < 0) return -1;
    s->done = true;
    return 0;
  }
  return ddp::store_bind::real_bind(fd, addr, len);
}
#endif  // DDP_INTERPOSE_BIND
