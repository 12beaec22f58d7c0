// LibTorch 1.13's TCPStore client starts a thread for watchKey() callbacks
// that polls a control pipe and a second connection to the server; a reset
// of that connection ends the process from the thread (std::terminate), and
// a closed one sets it spinning. Nothing of ours calls watchKey(), so
// store_client.cpp stops that thread before it runs: while a StoppedPipes
// lives, every pipe() this thread makes gets one byte in it at once, which is
// the thread's stop signal, seen on its first poll before the connection's
// events. Torch-free, so that the interposed pipe() lives in the program
// itself (bind_substitution.h says why): in libddp for the workers, in
// ddprun's executable for its store module. Built against LibTorch 1.13
// only (DDP_INTERPOSE_PIPE, src/CMakeLists.txt).
#pragma once

namespace ddp::stopped_pipes {

class StoppedPipes {
 public:
  StoppedPipes();
  ~StoppedPipes();
  StoppedPipes(const StoppedPipes&) = delete;
  StoppedPipes& operator=(const StoppedPipes&) = delete;
  // Pipes this thread made since the construction; 0 also where pipe() is
  // the C library's (not interposed: a program that finds libc's first).
  int made() const { return made_; }

 private:
  int made_ = 0;
  int* outer_ = nullptr;
};

}  // namespace ddp::stopped_pipes
