// The stall inspector, as Horovod's: when this rank has waited for a bucket's
// all-reduce longer than a threshold (below the process group's timeout), it
// says which ranks have not launched that bucket and which parameters the
// bucket holds, long before the hard timeout ends the job. Waiting ranks post
// their progress in the rendezvous store; a rank that posted nothing, or an
// older step, has not launched the bucket (a stopped or slow rank cannot
// post). A thread of its own watches, so the hot path pays two atomic stores
// per wait; it never takes the reducer's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

class StallInspector {
 public:
  // `threshold` > 0. `id` tells apart the models of one process in the store.
  StallInspector(std::shared_ptr<ProcessGroup> pg, std::chrono::milliseconds threshold, int id);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  // What each bucket holds, for the report (after every bucket rebuild).
  void set_buckets(std::vector<std::string> descriptions);
  // The calling thread waits for bucket `bucket` of synchronised step `step`,
  // having launched `launched` buckets; done_waiting() when it has them all.
  void waiting(int64_t step, int bucket, int launched);
  void done_waiting();

  // The threshold DDP uses: DDP_STALL_CHECK_TIME_SECONDS if set (0 turns the
  // inspector off), else `seconds`; kept below the group's timeout.
  static std::chrono::milliseconds threshold_for(double seconds, const ProcessGroup& pg);

 private:
  void run();
  void post(int64_t step, int launched);
  void report(int64_t step, int bucket, int64_t waited_ms);

  std::shared_ptr<ProcessGroup> pg_;
  std::chrono::milliseconds threshold_;
  std::string prefix_;
  std::atomic<int64_t> since_ns_{0};  // 0: not waiting
  std::atomic<int64_t> step_{-1};
  std::atomic<int> bucket_{-1}, launched_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<std::string> descriptions_;  // under mutex_
  int64_t posted_step_ = -1, reported_step_ = -1;
  int reported_bucket_ = -1;
  std::thread thread_;
};

}  // namespace ddp
