// The threads a communication backend starts inside this process, and how
// they are scheduled. Private to the core.
//
// Gloo's TCP transport runs one event-loop thread per device. When a message
// arrives while another thread (a process-group worker sending on the same
// pair) holds the pair's lock, the loop skips the event and, its descriptors
// being level-triggered, calls epoll_wait again at once: it spins until the
// lock is free. On Linux's EEVDF scheduler without wake-up preemption
// (PREEMPT_NONE kernels, the common server and VM configuration) a spinning
// thread keeps its CPU for a whole slice, up to a timer tick (4 ms at
// HZ=250): the worker that holds the lock waits that long, and a rank that
// waits for its peer spins on the peer's CPU while the peer computes
// (docs/performance.md, "Small models"). Running the loop thread under
// SCHED_IDLE keeps its spinning off every CPU that a normal thread wants:
// the kernel preempts an idle-policy thread as soon as a normal one wakes,
// and lets it run whenever nothing else does. It is opt-in: measured side by
// side on a 2-core VM it did not change DDP's step rate beyond the noise.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>

namespace ddp::detail {

// The ids of this process's threads now.
std::set<pid_t> thread_ids();

// The threads in `after` that are not in `before`.
std::set<pid_t> new_threads(const std::set<pid_t>& before, const std::set<pid_t>& after);

// How Gloo's event-loop thread is scheduled: "normal" (left as Gloo starts
// it, the default) or "idle" (SCHED_IDLE), from DDP_GLOO_LOOP_POLICY.
// Anything else is a UsageError naming the variable.
bool gloo_loop_idle_from_environment(int rank);

// Names the thread (as top -H and perf show it) and, if `idle`, moves it to
// SCHED_IDLE. Best effort, never throws: a thread that has already exited,
// or a system that refuses, keeps its defaults. `names_itself`: the thread
// sets a name of its own once it runs (LibTorch 2.x's Gloo workers); it is
// given up to 500 ms to do so first, so that ours stays.
void tune_comm_thread(pid_t tid, const std::string& name, bool idle, bool names_itself = false);

}  // namespace ddp::detail
