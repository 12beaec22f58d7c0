// The mpi backend's pieces that its two files share: process_group_mpi.cpp
// (MPI's runtime, the group, the collectives DDP needs) and
// mpi_collectives.cpp (the rest of ddp::dist's, and subgroups). Private;
// compiled only when CMake finds MPI (DDP_WITH_MPI).
#pragma once

#ifdef DDP_WITH_MPI

// MPI's C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/process_group.h"
#include "comm/c10d_compat.h"
#include "comm/work_handle.h"

namespace ddp::detail::mpi {

using Clock = std::chrono::steady_clock;

// MPI's process-wide state as libddp sees it. Leaked on purpose: the atexit
// handler and late destructors must still find it.
struct Runtime {
  std::mutex mutex;  // every MPI call of libddp holds it
  bool initialized_here = false;
  int thread_level = MPI_THREAD_SINGLE;
  // A collective timed out and its request is still pending: MPI_Finalize
  // would wait for it (and for the rank that never came), so it is skipped.
  std::atomic<bool> abandoned{false};
  MPI_Datatype two_bytes = MPI_DATATYPE_NULL;
  MPI_Op half_sum = MPI_OP_NULL, bfloat16_sum = MPI_OP_NULL;
  // Collectives still pending when their group went away (a Work dropped
  // unwaited): kept, with the buffers MPI may still write, until exit.
  std::vector<c10::intrusive_ptr<compat::Work>> orphans;
};

Runtime& runtime();

std::string error_string(int code);

// The backend's one wait loop: polls `done` (one MPI_Test, under the
// runtime's mutex) until it returns true or `deadline` passes, yielding for
// the first 200 polls and then sleeping 50 us between them. False at the
// deadline, with the runtime marked as holding an abandoned request (MPI
// never finishes it: MPI_Finalize and MPI_Comm_free are skipped then),
// unless `abandon` is false (a caller's own shorter wait: the request goes
// on and a later wait may still finish it).
template <typename Done>
bool poll_until(Done&& done, Clock::time_point deadline, bool abandon = true) {
  for (int spins = 0;; ++spins) {
    if (done()) return true;
    if (Clock::now() >= deadline) {
      if (abandon) runtime().abandoned = true;
      return false;
    }
    if (spins < 200) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Polls `request` until done or `deadline`; a timeout marks the runtime as
// holding an abandoned request and throws CommError(who + what + advice).
void wait_request(MPI_Request& request, Clock::time_point deadline, std::chrono::milliseconds timeout,
                  const std::string& who);

void free_comm(MPI_Comm& comm);

// One collective in flight. `buffer` is what MPI reads and writes (the
// tensor itself when it is a contiguous CPU tensor); `target`, when set, is
// the caller's tensor that gets the result back (CUDA or non-contiguous
// tensors, staged through a contiguous host copy).
class MpiWork final : public compat::Work {
 public:
  MpiWork(c10d::OpType type, std::string op, int rank, std::chrono::milliseconds timeout, at::Tensor buffer,
          at::Tensor target)
      : compat::Work(rank, type),
        type_(type),
        op_(std::move(op)),
        rank_(rank),
        timeout_(timeout),
        started_(Clock::now()),
        buffer_(std::move(buffer)),
        target_(std::move(target)) {}

  MPI_Request request = MPI_REQUEST_NULL;
  // Runs once, after the collective ends and before wait() returns: copies
  // a flat result into the caller's tensors. `keep`: what MPI reads or
  // writes besides the buffer, alive until then.
  std::function<void()> after;
  std::vector<at::Tensor> keep;

  // Under the runtime's mutex: one MPI_Test, which also progresses it.
  bool test_locked() {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request, &flag, &status);
    if (rc != MPI_SUCCESS) {
      error_ = error_string(rc);
      flag = 1;
    }
    if (flag) {
      if (rc == MPI_SUCCESS && type_ == c10d::OpType::RECVANYSOURCE) source_ = status.MPI_SOURCE;
      done_ = true;
    }
    return done_;
  }

  // A receive from any rank: the sender, once it has ended.
  int sourceRank() const override { return source_; }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    return test_locked();
  }

  // Bounded by the group's timeout from the collective's start, or by
  // `timeout` from now when one is given.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override {  // 0: c10d's kNoTimeout
    const auto limit = timeout.count() > 0 ? timeout : timeout_;
    const auto deadline = (timeout.count() > 0 ? Clock::now() : started_) + limit;
    // Past the group's timeout the request is abandoned; a shorter wait of
    // the caller's (Work::wait(timeout)) leaves it pending.
    const bool group_limit = Clock::now() + limit >= started_ + timeout_;
    if (!poll_until([this] { return isCompleted(); }, deadline, group_limit))
      throw std::runtime_error(
          "not finished within the timeout of " + std::to_string(limit.count()) + " ms on rank " +
          std::to_string(rank_) + ": some rank has not started this " + op_ +
          " (stuck, dead, or running different collectives). Check every rank's log; if they are merely slow, "
          "raise the timeout with ddp::ProcessGroupOptions().timeout(...)");
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (!error_.empty()) throw std::runtime_error(op_ + " failed in MPI: " + error_);
    if (!copied_) {
      if (target_.defined()) target_.copy_(buffer_);
      if (after) after();
      copied_ = true;
    }
    return true;
  }

  std::vector<at::Tensor> result() override { return {target_.defined() ? target_ : buffer_}; }

 private:
  c10d::OpType type_;
  int source_ = -1;
  std::string op_;
  int rank_;
  std::chrono::milliseconds timeout_;
  Clock::time_point started_;
  at::Tensor buffer_, target_;
  std::atomic<bool> done_{false};
  std::string error_;
  std::mutex finish_mutex_;
  bool copied_ = false;
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int size, torch::Device device, std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), device_(device), timeout_(timeout) {}
  ~MpiProcessGroup() override { shutdown(); }

  // Lets the communicator go (MPI frees it once what is pending on it
  // ends); later calls are a UsageError.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(runtime().mutex);
      if (comm_ == MPI_COMM_NULL) return;
      progress_locked();
      for (auto& w : outstanding_) runtime().orphans.push_back(w);
      outstanding_.clear();
    }
    free_comm(comm_);  // sets it to MPI_COMM_NULL
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }
  torch::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Work allreduce(at::Tensor& tensor) override;
  Work broadcast(at::Tensor& tensor, int root) override;
  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override;
  void barrier() override;

  // mpi_collectives.cpp
  Work collective(const CollectiveCall& call) override;
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks,
                                             std::chrono::milliseconds timeout) override;

 private:
  // mpi_collectives.cpp: start_collective starts the call by its kind, a
  // step each; `who` prefixes their errors.
  Work start_collective(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_reduce(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_broadcast(const CollectiveCall& call);
  c10::intrusive_ptr<MpiWork> start_gather(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_all_gather_into_tensor(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_scatter(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_reduce_scatter(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_all_to_all(const CollectiveCall& call, const std::string& who);
  c10::intrusive_ptr<MpiWork> start_p2p(const CollectiveCall& call, const std::string& who);
  at::Tensor int_array(const std::vector<int64_t>& v, const char* op) const;
  void live(const char* op) const {
    if (comm_ == MPI_COMM_NULL)
      throw UsageError("rank " + std::to_string(rank_) + ": " + op +
                       " on an mpi process group that destroy_process_group() has shut down: make a new one with "
                       "init_process_group() (or dist::new_group) and use that");
  }
  void check(const at::Tensor& tensor, const char* op) const {
    live(op);
    const std::string who = "rank " + std::to_string(rank_) + ": mpi " + op + ": ";
    if (!tensor.defined()) throw UsageError(who + "the tensor is undefined");
    if (tensor.is_sparse()) throw UsageError(who + "sparse tensors are not supported; densify them first");
#ifdef DDP_WITH_CUDA
    if (!tensor.is_cpu() && !tensor.is_cuda())
#else
    if (!tensor.is_cpu())
#endif
      throw UsageError(who + "tensors on " + tensor.device().str() +
                       " are not supported; the mpi backend takes CPU tensors (and CUDA tensors, staged through host "
                       "memory, in CUDA builds)");
  }

  int count_of(int64_t n, const char* op) const {
    if (n > INT_MAX)
      throw UsageError("rank " + std::to_string(rank_) + ": mpi " + op + ": a count of " + std::to_string(n) +
                       " (elements, or bytes for what travels as bytes) exceeds MPI's int; split the tensor "
                       "(under DDP: a smaller bucket_cap_mb)");
    return static_cast<int>(n);
  }

  // Stages `tensor` into a contiguous host buffer when it is not one itself,
  // tests the outstanding collectives (progress), then starts this one.
  // `keep` and `after`: MpiWork's.
  template <typename Start>
  c10::intrusive_ptr<MpiWork> start(c10d::OpType type, const char* op, at::Tensor& tensor, Start&& begin,
                                    std::vector<at::Tensor> keep = {}, std::function<void()> after = {}) {
    at::Tensor buffer = tensor, target;
    if (tensor.defined() && (!tensor.is_cpu() || !tensor.is_contiguous())) {
      buffer = tensor.to(at::kCPU).contiguous();  // synchronous: a CUDA tensor's producer has finished
      target = tensor;
    }
    live(op);
    auto work = c10::make_intrusive<MpiWork>(type, std::string(op), rank_, timeout_, buffer, target);
    work->keep = std::move(keep);
    work->after = std::move(after);
    std::lock_guard<std::mutex> lock(runtime().mutex);
    progress_locked();
    const int rc = begin(buffer.defined() ? buffer.data_ptr() : nullptr, &work->request);
    if (rc != MPI_SUCCESS)
      throw CommError("rank " + std::to_string(rank_) + ": mpi " + op + " could not start: " + error_string(rc));
    outstanding_.push_back(work);
    return work;
  }

  // Under the runtime's mutex. Completed collectives leave the list; the
  // list keeps every pending one's buffers alive even if its Work is dropped.
  void progress_locked() {
    std::vector<c10::intrusive_ptr<MpiWork>> pending;
    for (auto& w : outstanding_)
      if (!w->test_locked()) pending.push_back(w);
    outstanding_.swap(pending);
  }

  MPI_Comm comm_;
  int rank_, size_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  std::vector<c10::intrusive_ptr<MpiWork>> outstanding_;  // under the runtime's mutex
};

}  // namespace ddp::detail::mpi

#endif  // DDP_WITH_MPI
