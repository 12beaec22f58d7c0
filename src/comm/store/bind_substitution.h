// The substitution behind store_bind.cpp's servers on LibTorch 1.13 to 2.7:
// while a thread constructs a TCPStore server, this process's bind() answers
// c10d's bind of the wildcard address on the store's port with a socket we
// bound to one address (store_bind.cpp says how). Torch-free, so that the
// interposed bind() lives in the program itself: in libddp for the workers,
// in ddprun's executable for its store module, which LibTorch resolves
// bind() from (a module's own would come after the C library's).
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace ddp::store_bind {

// What this thread's bind() of the wildcard address on `port` gets instead.
struct Substitution {
  int listener = -1;
  uint16_t port = 0;
  bool done = false;  // set once c10d's bind was answered
};

// Sets this thread's substitution (nullptr: none). The caller keeps `s`
// alive until it clears it.
void set_thread_substitution(Substitution* s);

// The C library's bind(), past the substitution.
int real_bind(int fd, const sockaddr* addr, socklen_t len);

}  // namespace ddp::store_bind
