// The thread of a recoverable group (recoverable_group.cpp) that notices a
// fault while the main thread may be blocked in a collective, on a store
// connection of its own:
//  - a fault reported in the generation it watches (a rank whose step failed),
//  - a member reported lost by ddprun (its process ended),
//  - a member whose heartbeat stopped for the deadline (stopped, hung host,
//    cut link): each rank beats, and watches the next member's beat; it
//    reports that member lost itself.
// On any of them it calls `abort` once (it shuts the inner group's sockets
// down). Private to the core.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/c10d_compat.h"

namespace ddp::detail {

class FaultWatch {
 public:
  FaultWatch(c10::intrusive_ptr<c10d::Store> store, int round, int slot, std::chrono::milliseconds deadline,
             std::function<void()> abort);
  ~FaultWatch();
  FaultWatch(const FaultWatch&) = delete;
  FaultWatch& operator=(const FaultWatch&) = delete;

  // Watches generation `generation` of `members` (slots, in rank order):
  // faults counted from now on abort it. Called once it is formed.
  void watch(int generation, const std::vector<int>& members);
  // Stops watching (the group re-forms): no abort; the heartbeats go on,
  // and a silent neighbour is still reported lost.
  void pause();
  // Stops the thread.
  void stop();

 private:
  void run();
  void look(int epoch);
  void watch_neighbor(int epoch);
  void beat();
  void fire(int epoch);

  c10::intrusive_ptr<c10d::Store> store_;
  const int round_;
  const int slot_;
  const std::chrono::milliseconds deadline_;
  const std::function<void()> abort_;

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  int epoch_ = 0;          // +1 at each watch() and pause()
  bool watching_ = false;
  int generation_ = 0;
  std::vector<int> members_;
  int64_t generation_faults_ = 0;  // this generation's count when watching began
  int64_t lost_seen_ = 0;          // ddprun's count of lost workers last read
  int neighbor_ = -1;              // the member whose heartbeat this rank watches
  int64_t neighbor_beat_ = -1;
  std::chrono::steady_clock::time_point neighbor_since_;
  std::chrono::steady_clock::time_point next_beat_;
  std::thread thread_;
};

}  // namespace ddp::detail
