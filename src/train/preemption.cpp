#include "ddp/train/preemption.h"

#include "comm/objects/object_exchange.h"

#include <atomic>
#include <mutex>
#include <set>

namespace ddp {

namespace {

// A handler may only touch lock-free atomics.
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_signal(int signo) { g_received.store(signo, std::memory_order_relaxed); }

}  // namespace

void watch_preemption_signal(int signo) {
  static std::mutex mutex;
  static std::set<int> watched;
  std::lock_guard<std::mutex> lock(mutex);
  if (!watched.insert(signo).second) return;
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or a socket wait in progress goes on
  sigaction(signo, &sa, nullptr);
}

int preemption_signal_received() { return g_received.load(std::memory_order_relaxed); }

void clear_preemption_signal() { g_received.store(0, std::memory_order_relaxed); }

bool preemption_requested(ProcessGroup& pg) {
  return detail::any_rank(pg, preemption_signal_received() != 0);
}

}  // namespace ddp
