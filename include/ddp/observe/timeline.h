// A per-rank timeline of DDP's steps: forward, backward, each bucket's
// ready / launched / done, the wait after backward, the optimizer step. Times
// are microseconds on rank 0's clock (each rank's offset to it is measured
// when the timeline starts), and the whole job's timeline is written by rank 0
// as one Chrome trace-event JSON (chrome://tracing, Perfetto): a process row
// per rank, a thread row for compute and one for communication.
//
// Turned on by DDP_TIMELINE=<file> (Horovod's habit) before the model is
// wrapped; off, DDP records nothing and pays one null-pointer test per event:
//
//   DDP_TIMELINE=/tmp/trace.json ddprun --nproc-per-node 2 ./train
//
// The file is written when the DistributedDataParallel that started the
// timeline is destroyed (collective: every rank sends its events to rank 0).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

class Timeline {
 public:
  enum class Row : uint8_t { compute = 0, communication = 1 };

  // Collective: measures this rank's clock offset to rank 0 (a few broadcast
  // round trips per rank, the shortest kept, as NTP). `path` is where rank 0
  // writes the job's trace.
  Timeline(std::shared_ptr<ProcessGroup> pg, std::string path);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Now, in microseconds on rank 0's clock since the timeline started.
  int64_t now_us() const;
  // A span [start, end] on a row; `args` is a JSON object's members
  // ("\"bucket\": 3, \"bytes\": 4096") or empty. Thread-safe.
  void span(Row row, std::string name, int64_t start_us, int64_t end_us, std::string args = {});
  // A moment on a row. Thread-safe.
  void instant(Row row, std::string name, int64_t at_us, std::string args = {});
  // Bucket `bucket` of the current step was launched at `at_us`: the
  // launched instant, and a launch for the skew report.
  void bucket_launched(int bucket, int64_t at_us, std::string args);
  // A collective launched at `launch_us` ended now: a span on the
  // communication row from when the link could start on it (its launch, or
  // the end of the collective before it) to now. Called on the backend's
  // thread; takes only the timeline's own lock.
  void communication_done(std::string name, int64_t launch_us, std::string args = {});

  // Synchronised steps so far (the reducer counts them); events carry it.
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // Every `every` synchronised steps (0: never), the reducer calls
  // report_skew(): DDP_TIMELINE_SKEW_EVERY, or the training kit's
  // --timeline-skew-every.
  void set_skew_every(int64_t every) { skew_every_ = every; }
  bool skew_due() const { return skew_every_ > 0 && step_ > reported_through_ && step_ % skew_every_ == 0; }
  // Collective: the skew table of the steps since the last report (rank 0:
  // on its console and appended to `path` with .skew.txt for .json).
  void report_skew();

  const std::string& path() const { return path_; }

  // Collective: gathers every rank's events; rank 0 writes the trace
  // (atomically: a temporary file renamed over `path`) and the skew report:
  // for every step and bucket, the last rank to launch it and by how much
  // after the first, as `path` with .skew.csv for .json, and a table per
  // rank on its console and appended to .skew.txt. Once; later calls do nothing. Throws
  // CommError/UsageError naming the rank.
  void write();
  // Not collective: this rank's events alone, to `path`.rank<R>.json, for
  // when the job cannot gather (an exception is unwinding).
  void write_own_part() noexcept;

  // This rank's events as trace-event JSON objects separated by commas.
  std::string events_json() const;

 private:
  // Every rank's launches of steps [from_step, to_step) (collective).
  std::vector<std::string> gather_launches(int64_t from_step, int64_t to_step) const;
  std::string skew_table(const std::vector<std::string>& launches, const std::string& when, std::string* csv) const;
  std::string report_path(const std::string& suffix) const;
  void append_skew_table(const std::string& table) const;
  struct Event {
    char phase;  // 'X' span, 'i' instant
    Row row;
    int64_t ts, dur;
    int64_t step;
    std::string name, args;
  };
  std::shared_ptr<ProcessGroup> pg_;
  std::string path_;
  int64_t origin_ns_ = 0;  // this rank's steady clock at rank 0's start, in this rank's time
  int64_t offset_us_ = 0, offset_rtt_us_ = 0;
  int64_t step_ = 0;
  int64_t skew_every_ = 0, reported_through_ = 0;
  int64_t last_communication_end_us_ = 0;
  bool written_ = false;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  struct Launch {
    int64_t step;
    int bucket;
    int64_t at_us;
  };
  std::vector<Launch> launches_;
  std::string host_;
};

// The timeline DDP_TIMELINE asks for (collective when it is set: every rank
// must see the same variable), or null when it is unset or empty.
std::shared_ptr<Timeline> timeline_from_env(const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ddp
