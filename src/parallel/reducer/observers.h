// What watches the reducer, behind one narrow interface it calls at named
// points of a step, as PyTorch's Logger sits beside its Reducer: the
// runtime figures (ReducerStats, DDP's logging data), the timeline, the
// stall inspector and the automatic bucket size. An observer keeps its own
// state and reads what it is told; none touches a gradient or issues a
// collective inside a step (the timeline's skew report and the bucket-size
// agreement run between steps, on every rank alike).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/observe/timeline.h"
#include "ddp/parallel/ddp_options.h"
#include "ddp/parallel/reducer_stats.h"
#include "observe/stall_inspector.h"
#include "parallel/reducer/bucket_autotune.h"
#include "parallel/reducer/bucket_set.h"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

// A synchronised backward that ended, its gradients reduced.
struct StepEnd {
  Clock::time_point backward_end, wait_start, wait_end;
  int64_t unused_parameter_bytes = 0;
  bool communicated = false;          // the buckets went through a collective or a registered comm hook
  size_t buckets_skipped = 0;         // not reduced (skip_all_reduce_unused_params)
  int64_t bytes_skipped = 0;
  std::vector<size_t>* ready_order;   // this step's (every hook); whoever keeps it may take it
};

class ReducerObserver {
 public:
  virtual ~ReducerObserver() = default;
  virtual void buckets_laid_out(const BucketSet&) {}
  virtual void forward_started() {}
  virtual void backward_prepared() {}  // the forward's output is ready
  virtual void backward_started() {}   // the first hook of a synchronised backward
  virtual void bucket_ready(size_t /*k*/) {}
  virtual void bucket_launching(size_t /*k*/) {}  // before its collective starts
  virtual void bucket_launched(size_t /*k*/, Bucket&) {}
  virtual void wait_started() {}  // backward is over; the waits for the buckets begin
  // Before each wait: bucket `bucket` (buckets.size(): the used map) of step
  // `step` (the steps before this one), `launched` buckets launched.
  virtual void waiting_for(int64_t /*step*/, size_t /*bucket*/, size_t /*launched*/) {}
  virtual void bucket_done(size_t /*k*/, const Bucket&) {}
  virtual void wait_ended(bool /*completed*/) {}  // completed false: a wait threw
  // The gradients are final and the step is counted (`step`); then the
  // step's figures.
  virtual void step_counted(int64_t /*step*/) {}
  virtual void step_finished(const StepEnd&) {}
  virtual void shadow_step_finished() {}  // a joined rank shadowed a step (ddp::Join)
  // After every synchronised step, shadowed ones included (`step_ms` 0
  // then), once the step's state is reset; `layout_settled`: the buckets
  // follow the real ready order and no rebuild is pending.
  virtual void between_steps(double /*step_ms*/, bool /*layout_settled*/) {}
};

class Observers {
 public:
  void add(std::unique_ptr<ReducerObserver> observer) { list_.push_back(std::move(observer)); }
  template <typename Event>
  void each(Event&& event) {
    for (auto& o : list_) event(*o);
  }

 private:
  std::vector<std::unique_ptr<ReducerObserver>> list_;
};

// ReducerStats' runtime figures: PyTorch's DDP logging data (forward,
// backward compute, communication, overlap) and their means, the bytes and
// times of the last step.
class RuntimeFigures final : public ReducerObserver {
 public:
  explicit RuntimeFigures(ReducerStats& stats) : stats_(stats) {}
  void buckets_laid_out(const BucketSet& buckets) override;
  void forward_started() override { forward_start_ = Clock::now(); }
  void backward_prepared() override { output_ready_ = Clock::now(); }
  void backward_started() override {
    first_ready_ = Clock::now();
    comm_started_ = false;
  }
  void bucket_launching(size_t) override {  // the step's first launch (a skipped bucket launches nothing)
    if (!comm_started_) comm_start_ = Clock::now();
    comm_started_ = true;
  }
  void step_finished(const StepEnd& end) override;

 private:
  ReducerStats& stats_;
  int64_t bytes_ = 0;  // of every bucket
  Clock::time_point forward_start_, output_ready_, first_ready_, comm_start_;
  bool comm_started_ = false;
};

// Each backward's buckets on the timeline (ddp/observe/timeline.h): ready
// on the compute row, launched and done on the communication row; the
// backward and the wait for communication as spans; the step count and the
// periodic skew report.
class TimelineRecorder final : public ReducerObserver {
 public:
  TimelineRecorder(std::shared_ptr<Timeline> timeline, const BucketSet& buckets);
  void set_timeline(std::shared_ptr<Timeline> timeline) { timeline_ = std::move(timeline); }  // null: record nothing
  void buckets_laid_out(const BucketSet& buckets) override;
  void backward_started() override;
  void bucket_ready(size_t k) override;
  void bucket_launching(size_t k) override;
  void bucket_launched(size_t k, Bucket& b) override;
  void wait_started() override;
  void bucket_done(size_t k, const Bucket& b) override;
  void wait_ended(bool completed) override;
  void step_counted(int64_t step) override;
  void shadow_step_finished() override;

 private:
  std::string bucket_args(size_t k, const Bucket& b) const;
  struct Marks {
    int64_t ready_us = 0, launch_us = 0;  // on the timeline's clock
    bool end_reported = false;            // the backend says when it ends (else bucket_done does)
  };
  std::shared_ptr<Timeline> timeline_;  // null: unset
  std::vector<Marks> marks_;  // per bucket
  int64_t backward_start_us_ = 0, wait_start_us_ = 0;
};

// The stall inspector's view of the waits (observe/stall_inspector.h).
class StallWatch final : public ReducerObserver {
 public:
  StallWatch(std::unique_ptr<StallInspector> inspector, const std::vector<std::string>& names)
      : inspector_(std::move(inspector)), names_(names) {}
  void buckets_laid_out(const BucketSet& buckets) override;
  void waiting_for(int64_t step, size_t bucket, size_t launched) override {
    inspector_->waiting(step, static_cast<int>(bucket), static_cast<int>(launched));
  }
  void wait_ended(bool) override { inspector_->done_waiting(); }

 private:
  std::unique_ptr<StallInspector> inspector_;
  const std::vector<std::string>& names_;
};

// bucket_cap_mb("auto"): drives BucketAutotune's search from the steps'
// times and says which cap to lay the buckets out for before the next
// forward; agrees once across ranks (collective) when every candidate is timed.
class BucketCapSearch final : public ReducerObserver {
 public:
  using LayoutFor = std::function<Assignment(double cap_mb)>;
  BucketCapSearch(const DDPOptions& options, ProcessGroup& pg, ReducerStats& stats, LayoutFor layout_for,
                  std::string who);
  void between_steps(double step_ms, bool layout_settled) override;
  // The cap to lay the buckets out for before the next forward; 0: no change.
  double take_pending_cap();

 private:
  void finish();
  const DDPOptions& options_;
  ProcessGroup& pg_;
  ReducerStats& stats_;
  LayoutFor layout_for_;
  std::string who_;
  std::unique_ptr<BucketAutotune> autotune_;
  bool finished_ = false;
  double pending_cap_mb_ = 0;
};

}  // namespace ddp::detail
