// The mpi backend. Every collective is MPI's non-blocking one (MPI_Iallreduce,
// MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) behind a c10d::Work whose wait
// polls MPI_Test until done or the group's timeout: no MPI call ever blocks
// without a bound. Starting a collective also tests the outstanding ones, so
// Open MPI's non-blocking collectives (which progress only inside MPI calls)
// move on while backward computes. All MPI calls hold one mutex.
#include "comm/process_group_mpi.h"

// MPI's C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/c10d_compat.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

// Half and bfloat16 have no MPI type: two bytes, summed by these (in float,
// as c10 adds them).
template <typename T>
void sum_of(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

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
};

Runtime& runtime() {
  static Runtime* rt = new Runtime;
  return *rt;
}

void finalize_at_exit() {
  Runtime& rt = runtime();
  std::unique_lock<std::mutex> lock(rt.mutex, std::try_to_lock);
  if (!lock.owns_lock() || rt.abandoned) return;  // a thread stuck in MPI, or a pending collective
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized(const std::string& who) {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw UsageError(who + "MPI has been finalized in this process already; it cannot start again");
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) throw CommError(who + "MPI_Init_thread failed: " + error_string(rc));
    rt.initialized_here = true;
    std::atexit(finalize_at_exit);
  }
  MPI_Query_thread(&rt.thread_level);
  if (rt.thread_level < MPI_THREAD_SERIALIZED)
    throw UsageError(who + "this MPI library gives thread level " + std::to_string(rt.thread_level) +
                     "; libddp calls MPI from autograd's threads (one at a time) and needs at least "
                     "MPI_THREAD_SERIALIZED: use an MPI built with thread support (Open MPI is)");
  if (rt.two_bytes == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(2, MPI_BYTE, &rt.two_bytes);
    MPI_Type_commit(&rt.two_bytes);
    MPI_Op_create(&sum_of<c10::Half>, 1, &rt.half_sum);
    MPI_Op_create(&sum_of<c10::BFloat16>, 1, &rt.bfloat16_sum);
  }
}

// Polls `request` until done or `deadline`; a timeout marks the runtime as
// holding an abandoned request and throws CommError(who + what + advice).
void wait_request(MPI_Request& request, Clock::time_point deadline, std::chrono::milliseconds timeout,
                  const std::string& who) {
  Runtime& rt = runtime();
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard<std::mutex> lock(rt.mutex);
      int flag = 0;
      const int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) throw CommError(who + "failed in MPI: " + error_string(rc));
      if (flag) return;
    }
    if (Clock::now() >= deadline) {
      rt.abandoned = true;
      throw CommError(who + "not finished within the timeout of " + std::to_string(timeout.count()) +
                      " ms: some rank has not joined it (check that every rank was started by the same mpirun "
                      "and is not stuck; raise the timeout with ddp::ProcessGroupOptions().timeout(...) if they "
                      "are merely slow)");
    }
    if (spins < 200) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// A communicator of our own (MPI_Comm_idup, bounded by the timeout), so
// that libddp's collectives never match a user's on MPI_COMM_WORLD.
MPI_Comm duplicate_world(std::chrono::milliseconds timeout, const std::string& who) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    const int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request);
    if (rc != MPI_SUCCESS) throw CommError(who + "MPI_Comm_idup failed: " + error_string(rc));
  }
  wait_request(request, Clock::now() + timeout, timeout, who + "duplicating MPI_COMM_WORLD: ");
  std::lock_guard<std::mutex> lock(runtime().mutex);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

void free_comm(MPI_Comm& comm) {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !rt.abandoned && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

// One collective in flight. `buffer` is what MPI reads and writes (the
// tensor itself when it is a contiguous CPU tensor); `target`, when set, is
// the caller's tensor that gets the result back (CUDA or non-contiguous
// tensors, staged through a contiguous host copy).
class MpiWork final : public compat::Work {
 public:
  MpiWork(c10d::OpType type, std::string op, int rank, std::chrono::milliseconds timeout, at::Tensor buffer,
          at::Tensor target)
      : compat::Work(rank, type),
        op_(std::move(op)),
        rank_(rank),
        timeout_(timeout),
        started_(Clock::now()),
        buffer_(std::move(buffer)),
        target_(std::move(target)) {}

  MPI_Request request = MPI_REQUEST_NULL;

  // Under the runtime's mutex: one MPI_Test, which also progresses it.
  bool test_locked() {
    if (done_) return true;
    int flag = 0;
    const int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      error_ = error_string(rc);
      flag = 1;
    }
    if (flag) done_ = true;
    return done_;
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    return test_locked();
  }

  // Bounded by the group's timeout from the collective's start, or by
  // `timeout` from now when one is given.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override {  // 0: c10d's kNoTimeout
    const auto limit = timeout.count() > 0 ? timeout : timeout_;
    const auto deadline = (timeout.count() > 0 ? Clock::now() : started_) + limit;
    for (int spins = 0;; ++spins) {
      if (isCompleted()) break;
      if (Clock::now() >= deadline) {
        runtime().abandoned = true;
        throw std::runtime_error(
            "not finished within the timeout of " + std::to_string(limit.count()) + " ms on rank " +
            std::to_string(rank_) + ": some rank has not started this " + op_ +
            " (stuck, dead, or running different collectives). Check every rank's log; if they are merely slow, "
            "raise the timeout with ddp::ProcessGroupOptions().timeout(...)");
      }
      if (spins < 200) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (!error_.empty()) throw std::runtime_error(op_ + " failed in MPI: " + error_);
    if (target_.defined() && !copied_) {
      target_.copy_(buffer_);
      copied_ = true;
    }
    return true;
  }

  std::vector<at::Tensor> result() override { return {target_.defined() ? target_ : buffer_}; }

 private:
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
  ~MpiProcessGroup() override { free_comm(comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }
  torch::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Work allreduce(at::Tensor& tensor) override {
    check(tensor, "allreduce");
    MPI_Datatype type;
    MPI_Op op = MPI_SUM;
    switch (tensor.scalar_type()) {
      case at::kFloat: type = MPI_FLOAT; break;
      case at::kDouble: type = MPI_DOUBLE; break;
      case at::kHalf: type = runtime().two_bytes; op = runtime().half_sum; break;
      case at::kBFloat16: type = runtime().two_bytes; op = runtime().bfloat16_sum; break;
      case at::kChar: type = MPI_INT8_T; break;
      case at::kByte: type = MPI_UINT8_T; break;
      case at::kInt: type = MPI_INT32_T; break;
      case at::kLong: type = MPI_INT64_T; break;
      default:
        throw UsageError("rank " + std::to_string(rank_) + ": mpi allreduce: tensors of " +
                         std::string(c10::toString(tensor.scalar_type())) +
                         " cannot be summed by the mpi backend; it sums float, double, half, bfloat16, int8, uint8, "
                         "int32 and int64 tensors");
    }
    const int count = count_of(tensor.numel(), "allreduce");
    auto work = start(c10d::OpType::ALLREDUCE, "allreduce", tensor, [&](void* data, MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, comm_, request);
    });
    return Work(work, "mpi allreduce", rank_);
  }

  Work broadcast(at::Tensor& tensor, int root) override {
    check(tensor, "broadcast");
    const int bytes = count_of(tensor.numel() * static_cast<int64_t>(tensor.element_size()), "broadcast");
    auto work = start(c10d::OpType::BROADCAST, "broadcast", tensor, [&](void* data, MPI_Request* request) {
      return MPI_Ibcast(data, bytes, MPI_BYTE, root, comm_, request);
    });
    return Work(work, "mpi broadcast", rank_);
  }

  std::vector<at::Tensor> allgather(const at::Tensor& tensor) override {
    check(tensor, "allgather");
    const at::Tensor mine = tensor.to(at::kCPU).contiguous();
    const int bytes = count_of(mine.numel() * static_cast<int64_t>(mine.element_size()), "allgather");
    auto gathered = at::empty({static_cast<int64_t>(size_) * mine.numel()}, mine.options());
    auto work = start(c10d::OpType::ALLGATHER, "allgather", gathered, [&](void* data, MPI_Request* request) {
      return MPI_Iallgather(mine.data_ptr(), bytes, MPI_BYTE, data, bytes, MPI_BYTE, comm_, request);
    });
    Work(work, "mpi allgather", rank_).wait();
    std::vector<at::Tensor> out;
    for (int r = 0; r < size_; ++r)
      out.push_back(gathered.narrow(0, r * mine.numel(), mine.numel()).view(tensor.sizes()).to(tensor.device()));
    return out;
  }

  void barrier() override {
    at::Tensor none;
    auto work = start(c10d::OpType::BARRIER, "barrier", none, [&](void*, MPI_Request* request) {
      return MPI_Ibarrier(comm_, request);
    });
    Work(work, "mpi barrier", rank_).wait();
  }

 private:
  void check(const at::Tensor& tensor, const char* op) const {
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
      throw UsageError("rank " + std::to_string(rank_) + ": mpi " + op + ": " + std::to_string(n) +
                       " elements exceed MPI's int count; split the tensor (e.g. a smaller bucket_cap_mb)");
    return static_cast<int>(n);
  }

  // Stages `tensor` into a contiguous host buffer when it is not one itself,
  // tests the outstanding collectives (progress), then starts this one.
  template <typename Start>
  c10::intrusive_ptr<MpiWork> start(c10d::OpType type, const char* op, at::Tensor& tensor, Start&& begin) {
    at::Tensor buffer = tensor, target;
    if (tensor.defined() && (!tensor.is_cpu() || !tensor.is_contiguous())) {
      buffer = tensor.to(at::kCPU).contiguous();  // synchronous: a CUDA tensor's producer has finished
      target = tensor;
    }
    auto work = c10::make_intrusive<MpiWork>(type, std::string(op), rank_, timeout_, buffer, target);
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

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine, std::chrono::milliseconds timeout,
                                           const std::string& who) {
  int size = 1;
  const auto deadline = Clock::now() + timeout;
  std::vector<int> lengths;
  MPI_Request request = MPI_REQUEST_NULL;
  int length = static_cast<int>(mine.size());
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    MPI_Comm_size(comm, &size);
    lengths.resize(static_cast<size_t>(size));
    MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, &request);
  }
  wait_request(request, deadline, timeout, who);
  std::vector<int> offsets(static_cast<size_t>(size), 0);
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    MPI_Iallgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm,
                    &request);
  }
  wait_request(request, deadline, timeout, who);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                                     torch::Device device, const std::string& who) {
  ensure_initialized(who);
  int rank = 0, size = 1;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  if (rank != env.rank || size != env.world_size)
    throw LaunchEnvError(who + "MPI says this process is rank " + std::to_string(rank) + " of " +
                         std::to_string(size) + ", but the launch environment (" + env.source_name() +
                         ") says rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                         ": start every rank with one mpirun and do not set RANK or WORLD_SIZE yourself");
  MPI_Comm comm = duplicate_world(timeout, who);
  return std::make_shared<MpiProcessGroup>(comm, rank, size, device, timeout);
}

MasterRoute learn_master_route_over_mpi(std::chrono::milliseconds timeout, const std::string& who) {
  ensure_initialized(who);
  MPI_Comm comm = duplicate_world(timeout, who);
  std::vector<std::string> lists;
  try {
    lists = allgather_strings(comm, encode_interfaces(local_ipv4_interfaces()), timeout,
                              who + "gathering every rank's network interfaces over MPI (to learn rank 0's address): ");
  } catch (...) {
    free_comm(comm);
    throw;
  }
  free_comm(comm);
  std::vector<std::vector<Ipv4Interface>> per_rank;
  for (const auto& l : lists) per_rank.push_back(decode_interfaces(l));
  try {
    return choose_master_route(per_rank);
  } catch (const CommError& e) {
    throw CommError(who + "mpirun across several hosts without MASTER_ADDR: " + e.what());
  }
}

std::string mpi_library_version_text() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(text, &len);  // allowed before MPI_Init
  std::string s(text, static_cast<size_t>(len));
  s = s.substr(0, s.find_first_of(",\n"));  // "Open MPI v4.1.4", without the package and repository
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace ddp::detail
