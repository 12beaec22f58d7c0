// The mpi backend. Every collective is MPI's non-blocking one (MPI_Iallreduce,
// MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) behind a c10d::Work whose wait
// polls MPI_Test until done or the group's timeout: no MPI call ever blocks
// without a bound. Starting a collective also tests the outstanding ones, so
// Open MPI's non-blocking collectives (which progress only inside MPI calls)
// move on while backward computes. All MPI calls hold one mutex.
#include "comm/backend/process_group_mpi.h"

#include <cstdlib>

#include "comm/backend/mpi_group.h"

namespace ddp::detail {
namespace mpi {

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

namespace {

// Half and bfloat16 have no MPI type: two bytes, summed by these (in float,
// as c10 adds them).
template <typename T>
void sum_of(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

}  // namespace

Runtime& runtime() {
  static Runtime* rt = new Runtime;
  return *rt;
}

namespace {

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

}  // namespace

void wait_request(MPI_Request& request, Clock::time_point deadline, std::chrono::milliseconds timeout,
                  const std::string& who) {
  const bool done = poll_until(
      [&] {
        std::lock_guard<std::mutex> lock(runtime().mutex);
        int flag = 0;
        const int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) throw CommError(who + "failed in MPI: " + error_string(rc));
        return flag != 0;
      },
      deadline);
  if (!done)
    throw CommError(who + "not finished within the timeout of " + std::to_string(timeout.count()) +
                    " ms: some rank has not joined it (check that every rank was started by the same mpirun "
                    "and is not stuck; raise the timeout with ddp::ProcessGroupOptions().timeout(...) if they "
                    "are merely slow)");
}

namespace {

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

}  // namespace

void free_comm(MPI_Comm& comm) {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !rt.abandoned && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

Work MpiProcessGroup::allreduce(at::Tensor& tensor) {
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
  return detail::make_work(work, "mpi allreduce", rank_);
}

Work MpiProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check(tensor, "broadcast");
  const int bytes = count_of(tensor.numel() * static_cast<int64_t>(tensor.element_size()), "broadcast");
  auto work = start(c10d::OpType::BROADCAST, "broadcast", tensor, [&](void* data, MPI_Request* request) {
    return MPI_Ibcast(data, bytes, MPI_BYTE, root, comm_, request);
  });
  return detail::make_work(work, "mpi broadcast", rank_);
}

std::vector<at::Tensor> MpiProcessGroup::allgather(const at::Tensor& tensor) {
  check(tensor, "allgather");
  const at::Tensor mine = tensor.to(at::kCPU).contiguous();
  const int bytes = count_of(mine.numel() * static_cast<int64_t>(mine.element_size()), "allgather");
  auto gathered = at::empty({static_cast<int64_t>(size_) * mine.numel()}, mine.options());
  auto work = start(c10d::OpType::ALLGATHER, "allgather", gathered, [&](void* data, MPI_Request* request) {
    return MPI_Iallgather(mine.data_ptr(), bytes, MPI_BYTE, data, bytes, MPI_BYTE, comm_, request);
  });
  detail::make_work(work, "mpi allgather", rank_).wait();
  std::vector<at::Tensor> out;
  for (int r = 0; r < size_; ++r)
    out.push_back(gathered.narrow(0, r * mine.numel(), mine.numel()).view(tensor.sizes()).to(tensor.device()));
  return out;
}

void MpiProcessGroup::barrier() {
  at::Tensor none;
  auto work = start(c10d::OpType::BARRIER, "barrier", none, [&](void*, MPI_Request* request) {
    return MPI_Ibarrier(comm_, request);
  });
  detail::make_work(work, "mpi barrier", rank_).wait();
}

namespace {

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
}  // namespace mpi

using namespace mpi;

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
