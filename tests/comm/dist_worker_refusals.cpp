// dist_worker's refusals and ends: `errors` (every refusal that must come
// before anything starts, then the group still works, and Work as
// torch.distributed's), `monitored` (Gloo's monitored barrier naming the
// ranks that did not come) and `teardown` (the group destroyed while held).
#include <ddp/ddp.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "dist_worker.h"

namespace dist = ddp::dist;
using ddp::ReduceOp;

namespace dist_worker {
namespace {

// A function of isend's type that is not isend: P2POp refuses it.
ddp::Work not_isend(const at::Tensor& t, int dst, const dist::Group& g, int tag) { return dist::isend(t, dst, g, tag); }

// Work and groups as torch.distributed's: a receive's source_rank(), a
// send's refused; is_completed(); wait(timeout), which under mpi gives up
// on a receive whose send comes later (a timed-out Gloo receive is finished
// with its error, so there only the wait that succeeds); group::WORLD,
// new_group(ranks, backend) and ranks of another integer type.
void work_api(int rank) {
  const bool mpi = dist::get_backend() == "mpi";
  if (rank == 0) {
    auto r = zeros({2});
    auto w = dist::irecv(r, 1, {}, 97);
    if (mpi) {
      try {
        w.wait(std::chrono::milliseconds(300));
        std::cout << "NOERR wait_timeout" << std::endl;
      } catch (const ddp::CommError& e) {
        const std::string m = e.what();
        std::cout << "ERR wait_timeout: " << m.substr(0, m.find('\n')) << std::endl;
        std::cout << "wait_timeout_advice " << (m.find("ddp::Join") == std::string::npos ? "p2p" : "collective")
                  << std::endl;
      }
      std::cout << "completed_before " << w.is_completed() << std::endl;
    }
    dist::barrier();
    w.wait(std::chrono::seconds(60));
    std::cout << "completed_after " << w.is_completed() << " source " << w.source_rank() << std::endl;
  } else {
    dist::barrier();
    if (rank == 1) {
      auto w = dist::isend(torch::ones({2}).to(g_device), 0, {}, 97);
      w.wait();
      try {
        (void)w.source_rank();
        std::cout << "NOERR send_source_rank" << std::endl;
      } catch (const ddp::UsageError& e) {
        std::cout << "ERR send_source_rank: " << e.what() << std::endl;
      }
    }
  }
  // work.get_future(): completed with the output tensors (Gloo, NCCL); the
  // mpi backend has none.
  auto summed = torch::ones({2}).to(g_device);
  auto w = dist::all_reduce(summed, ReduceOp::SUM, {}, true);
  try {
    auto future = w.get_future();
    future->wait();
    std::cout << "future " << future->value().toTensorList().get(0).sum().item<double>() << std::endl;
  } catch (const ddp::UsageError& e) {
    w.wait();
    std::cout << "ERR get_future: " << e.what() << std::endl;
  }
  // Objects built as Python writes them, all-gathered.
  std::vector<c10::IValue> built(static_cast<size_t>(dist::get_world_size()));
  dist::all_gather_object(built, dist::dict({{"rank", rank}, {"names", dist::list({"a", "b"})},
                                             {"shape", dist::tuple({2, 3})}}));
  std::cout << "built " << show(built[1]) << std::endl;
  auto g = dist::new_group(std::vector<int64_t>{0, 1});
  auto g_named = dist::new_group({0, 1}, "");
  std::cout << "groups " << dist::get_rank(dist::group::WORLD) << " " << dist::get_world_size(g) << " "
            << dist::get_world_size(g_named) << std::endl;
}

}  // namespace

// Gloo's monitored barrier at 3 ranks: every rank comes (it passes), then
// rank 0 comes alone and names the ranks that did not, within 1 s. The
// ranks end without tearing the group down (what the failed barrier left
// pending is not waited for).
void monitored() {
  const int rank = dist::get_rank();
  dist::monitored_barrier();
  std::cout << "passed" << std::endl;
  if (rank == 0) {
    try {
      dist::monitored_barrier({}, std::chrono::milliseconds(1000), true);
      std::cout << "NOERR monitored" << std::endl;
    } catch (const ddp::CommError& e) {
      std::cout << "ERR monitored: " << e.what() << std::endl;
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
  std::_Exit(0);
}

// Refusals that come before anything starts; the group works after them.
void errors() {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  auto expect = [&](const std::string& name, auto&& fn) {
    try {
      fn();
      std::cout << "NOERR " << name << std::endl;
    } catch (const ddp::UsageError& e) {
      std::string m = e.what();
      std::cout << "ERR " << name << ": " << m.substr(0, m.find('\n')) << std::endl;
    }
  };
  expect("avg", [&] { dist::all_reduce(torch::ones({2}), ReduceOp::AVG); });
  expect("band_float", [&] { dist::all_reduce(torch::ones({2}), ReduceOp::BAND); });
  expect("src_outside", [&] { dist::broadcast(torch::ones({2}), world); });
  expect("gather_list_elsewhere", [&] {
    std::vector<at::Tensor> l(static_cast<size_t>(world), zeros({2}));
    dist::gather(torch::ones({2}), rank == 0 ? std::vector<at::Tensor>{} : l, 0);
  });
  expect("scatter_list_missing", [&] { dist::scatter(zeros({2}), {}, rank); });
  expect("undefined", [&] { dist::all_reduce(at::Tensor()); });
  expect("new_group_twice", [&] { dist::new_group({0, 0}); });
  expect("new_group_outside", [&] { dist::new_group({0, world}); });
  expect("group_rank_outside", [&] { dist::get_group_rank(dist::Group{}, world + 3); });
  expect("send_self", [&] { dist::send(torch::ones({2}), rank); });
  expect("premul_bare", [&] { dist::all_reduce(torch::ones({2}), ReduceOp::PREMUL_SUM); });
  expect("premul_here", [&] { dist::all_reduce(torch::ones({2}), dist::make_nccl_premul_sum(2.0)); });
  expect("batch_empty", [&] { (void)dist::batch_isend_irecv({}); });
  expect("p2p_op", [&] { dist::P2POp(not_isend, torch::ones({2}), (rank + 1) % world); });
  expect("object_list_size", [&] {
    std::vector<c10::IValue> list(1);
    dist::all_gather_object(list, int64_t{1});
  });
  expect("object_not_plain", [&] {
    std::vector<c10::IValue> list(static_cast<size_t>(world));
    dist::all_gather_object(list, c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get()));
  });
  expect("new_group_backend", [&] { dist::new_group({}, std::nullopt, "ucc"); });
  expect("scatter_object_refused", [&] {  // src's list is one short: every rank hears of it at once
    std::vector<c10::IValue> mine(1), ins(static_cast<size_t>(world - 1), int64_t{1});
    dist::scatter_object_list(mine, rank == 0 ? &ins : nullptr, 0);
  });
  expect("dict_keys", [&] { (void)dist::dict({{"a", 1}, {2, 3}}); });
  if (dist::get_backend() != "gloo") expect("monitored_barrier", [&] { dist::monitored_barrier(); });
  if (dist::get_backend() == "mpi")
    expect("dtype_mismatch", [&] {
      dist::all_to_all_single(zeros({2 * world}, at::kDouble), zeros({2 * world}, at::kFloat));
    });
  auto t = torch::ones({3});
  dist::all_reduce(t);
  std::cout << "after " << t.sum().item<double>() << std::endl;
  work_api(rank);
}

// destroy_process_group() while this program still holds the group: the
// default is gone and every later call on the held group is a UsageError.
void teardown() {
  auto held = ddp::default_process_group();
  auto t = torch::ones({3});
  held->allreduce(t).wait();
  std::cout << "before " << t.sum().item<double>() << std::endl;
  ddp::destroy_process_group();
  std::cout << "initialized " << ddp::is_initialized() << std::endl;
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"allreduce", [&] { held->allreduce(t).wait(); }},
      {"barrier", [&] { held->barrier(); }},
      {"all_gather", [&] { held->allgather(t); }},
      {"dist_broadcast", [&] { dist::broadcast(t, 0, held); }},
      {"dist_all_reduce_default", [&] { dist::all_reduce(t); }},
  };
  for (const auto& [name, call] : calls) {
    try {
      call();
      std::cout << "ran " << name << std::endl;
    } catch (const ddp::UsageError& e) {
      std::cout << "ERR " << name << ": " << e.what() << std::endl;
    }
  }
}

}  // namespace dist_worker
