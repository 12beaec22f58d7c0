// One rank of a multi-process DDP test. Started by the tests (through
// multiprocess.h) with torchrun's variables; checks its own results and exits
// 0 on success, 1 with a message otherwise. The scenario is argv[1]; several
// scenarios, each with its flags, are separated by "--then" and share one
// process start and one process group (the mpi tests run every scenario in
// one mpirun).
#include <sys/resource.h>

#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "../support/fake_process_group.h"
#include "../support/worker_common.h"
#include "parallel/ddp_internals.h"

using namespace std::chrono_literals;

using namespace ddp::testing;

namespace {

// argv[1..] as (scenario, flags) runs, split at "--then".
std::vector<std::pair<std::string, Flags>> parse_runs(int argc, char** argv) {
  std::vector<std::pair<std::string, Flags>> runs;
  for (int i = 1; i < argc;) {
    runs.emplace_back(argv[i++], Flags{});
    while (i < argc && std::string(argv[i]) != "--then") {
      if (i + 1 < argc) runs.back().second[argv[i]] = argv[i + 1];
      i += 2;
    }
    ++i;  // past "--then"
  }
  return runs;
}

// Each rank's gradients equal the single-process gradients of the
// concatenated batch; parameters stay identical over the steps.
int scenario_grads(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                   std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const bool mixed = flags["--mixed"] == "1";
  const int steps = flags.count("--steps") ? std::stoi(flags["--steps"]) : 20;
  const int per_rank = 6;
  auto counting = std::make_shared<ddp::testing::CountingGroup>(pg_ptr);
  // Rank-skewed initial weights: DDP must make every rank take rank 0's.
  torch::manual_seed(flags["--skew"] == "1" ? 17 + rank : 17);
  const bool reversed = flags["--reversed"] == "1";
  Net net(mixed, false, 4, false, reversed);
  Net ref(mixed, false, 4, false, reversed);
  auto options = ddp::DDPOptions()
                     .bucket_cap_mb(flags.count("--bucket-cap-mb") ? std::stod(flags["--bucket-cap-mb"]) : 25.0)
                     .first_bucket_mb(flags.count("--first-bucket-mb") ? std::stod(flags["--first-bucket-mb"]) : 1.0)
                     .gradient_as_bucket_view(flags["--as-view"] != "0");
  ddp::DistributedDataParallel model(net, counting, options);
  expect_same_across_ranks(raw, net->parameters(), "initial parameters");
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto initial_buckets = ddp::reducer_of(model).bucket_indices();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, per_rank * world);
    copy_params(*net, *ref);
    ref->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    if (flags["--set-to-none"] == "1") {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();  // LibTorch 2.x's zero_grad()
    } else {
      opt.zero_grad();
    }
    const int64_t before = counting->counts().allreduces;
    auto loss = torch::mse_loss(model(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank));
    loss.backward();
    EXPECT_OR_FAIL(counting->counts().allreduces - before == static_cast<int64_t>(model.stats().num_buckets),
                   "one all-reduce per bucket");
    expect_grads_close(*net, *ref, "step " + std::to_string(step));
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters after step " + std::to_string(step));
  }
  const auto& s = model.stats();
  std::cout << "rank " << rank << ": buckets=" << s.num_buckets << " rebuilt=" << s.buckets_rebuilt
            << " bytes=" << s.bytes_reduced << " exposed_ms=" << s.exposed_comm_ms << std::endl;
  if (flags.count("--min-buckets"))
    EXPECT_OR_FAIL(s.num_buckets >= std::stoul(flags["--min-buckets"]), "expected several buckets");
  if (steps >= 2) EXPECT_OR_FAIL(s.buckets_rebuilt, "buckets were not rebuilt after the first iteration");
  if (reversed && steps >= 2 && s.num_buckets > 1)
    EXPECT_OR_FAIL(ddp::reducer_of(model).bucket_indices() != initial_buckets,
                   "the rebuild kept the guessed buckets although gradients arrived in another order");
  return 0;
}

int scenario_batchnorm(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(3 + rank);
  Net net(false, true);
  ddp::DistributedDataParallel model(net, pg);
  expect_same_across_ranks(raw, net->buffers(), "initial buffers");
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters");
  }
  // Buffers differ after each local forward; before the next one every rank
  // takes rank 0's, so the same input now gives the same buffers everywhere.
  auto [x, y] = global_batch(99, 6);
  model(x);
  expect_same_across_ranks(raw, net->buffers(), "BatchNorm buffers");
  return 0;
}

int scenario_unused(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const std::string mode = flags["--mode"];
  torch::manual_seed(5);
  Net net(false, false, 4, true);
  Net ref(false, false, 4, true);
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().find_unused_parameters(mode != "error"));
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    const bool use_extra = mode == "rank0" && rank == 0;
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6));
    if (mode == "error") {
      // As PyTorch: the backward returns, the next forward throws.
      loss.backward();
      try {
        model(x.narrow(0, 6 * rank, 6), use_extra);
      } catch (const c10::Error& e) {
        std::string what = e.what();
        std::cout << "caught: " << what << std::endl;
        EXPECT_OR_FAIL(what.find("extra.weight") != std::string::npos, "the error names the parameter");
        EXPECT_OR_FAIL(what.find("find_unused_parameters") != std::string::npos, "the error says what to do");
        EXPECT_OR_FAIL(what.find("prior iteration") != std::string::npos, "PyTorch's words");
        return 0;
      }
      throw Fail("the forward after a backward with an unused parameter did not fail");
    }
    loss.backward();
    if (mode == "none") {
      copy_params(*net, *ref);
      ref->zero_grad();
      torch::mse_loss(ref->forward(x), y).backward();
      expect_grads_close(*net, *ref, "unused step " + std::to_string(step));
      EXPECT_OR_FAIL(!net->extra->weight.grad().defined(), "a parameter no rank used keeps an undefined gradient");
    } else {
      EXPECT_OR_FAIL(net->extra->weight.grad().defined(), "a parameter rank 0 used has a gradient everywhere");
      expect_same_across_ranks(raw, {net->extra->weight.grad(), net->l1->weight.grad()}, "gradients");
    }
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters");
  }
  return 0;
}

// Gradients accumulated under no_sync, then one synchronised backward; with
// --unused-branch 1 (and find_unused_parameters) the extra layer is used in
// the no_sync micro-steps only, and must still get the average of what every
// rank accumulated.
int scenario_no_sync(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                     std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const bool branch = flags["--unused-branch"] == "1";
  auto counting = std::make_shared<ddp::testing::CountingGroup>(pg_ptr);
  torch::manual_seed(7);
  Net net(false, false, 4, branch);
  Net ref(false, false, 4, branch);
  ddp::DistributedDataParallel model(net, counting, ddp::DDPOptions().find_unused_parameters(branch));
  copy_params(*net, *ref);
  net->zero_grad();
  ref->zero_grad();
  for (int micro = 0; micro < 4; ++micro) {
    // Not a structured binding: the lambda below captures x and y, which
    // clang before 16 refuses for bindings (C++20); the sanitized build uses clang.
    torch::Tensor x, y;
    std::tie(x, y) = global_batch(micro, 6 * world);
    const bool use_extra = branch && micro < 3;
    torch::mse_loss(ref->forward(x, use_extra), y).backward();
    auto local = [&] {
      return torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6));
    };
    const int64_t before = counting->counts().allreduces;
    if (micro < 3) {
      auto guard = model.no_sync();
      local().backward();
      EXPECT_OR_FAIL(counting->counts().allreduces == before, "no communication inside no_sync");
    } else {
      local().backward();
      EXPECT_OR_FAIL(counting->counts().allreduces > before, "the synchronised backward communicates");
    }
  }
  expect_grads_close(*net, *ref, "after 3 no_sync micro-batches and 1 synchronised", branch);
  return 0;
}

// Rank 1 builds a different model (--kind shape, the default), freezes a
// layer (frozen) or lays a weight out differently (strides): every rank
// fails with an error naming the difference.
int scenario_mismatch(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg,
                      std::map<std::string, std::string> flags) {
  const std::string kind = flags.count("--kind") ? flags["--kind"] : "shape";
  const bool odd = raw.rank() == 1;
  Net net(false, false, odd && kind == "shape" ? 5 : 4);
  std::string expected_name = "l3.weight";
  if (odd && kind == "frozen") {
    net->l1->weight.set_requires_grad(false);
    net->l1->bias.set_requires_grad(false);
    expected_name = "l1.weight";
  }
  if (odd && kind == "strides") {
    torch::NoGradGuard g;
    net->l2->weight.set_data(net->l2->weight.t().contiguous().t());
    expected_name = "l2.weight";
  }
  try {
    ddp::DistributedDataParallel model(net, pg);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("not the same on every rank") != std::string::npos, "names the problem");
    EXPECT_OR_FAIL(what.find("rank " + std::to_string(raw.rank())) == 0, "names this rank");
    if (odd) EXPECT_OR_FAIL(what.find(expected_name) != std::string::npos, "names the parameter");
    return 0;
  }
  throw Fail("different models on different ranks were accepted");
}

// DDPOptions::malloc_mmap_threshold_mb: by default malloc's thresholds are
// left to glibc; asked for the automatic choice (-1, by option or by
// DDP_MALLOC_MMAP_THRESHOLD_MB), a model with a 16 MiB weight fixes them at
// that size and a small one leaves them. fix_malloc_thresholds() latches its
// first applied call, so asking for 1 MiB afterwards tells what
// DistributedDataParallel did.
int scenario_malloc(std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const bool large = flags["--model"] == "large";
  const bool automatic = flags["--auto"] == "1";
  torch::nn::Linear net(large ? 2048 : 32, large ? 2048 : 4);
  auto options = ddp::DDPOptions();
  if (automatic) options.malloc_mmap_threshold_mb(-1);
  if (flags.count("--expect-error")) {
    try {
      ddp::DistributedDataParallel model(net, pg, options);
    } catch (const std::exception& e) {
      std::cout << "caught: " << e.what() << std::endl;
      EXPECT_OR_FAIL(std::string(e.what()).find(flags["--expect-error"]) != std::string::npos, e.what());
      // The refusal comes before any collective: a rank that ended at once
      // could close its connection while another still finished joining.
      pg->barrier();
      return 0;
    }
    throw Fail("no error for DDP_MALLOC_MMAP_THRESHOLD_MB=" + std::string(std::getenv("DDP_MALLOC_MMAP_THRESHOLD_MB")));
  }
  ddp::DistributedDataParallel model(net, pg, options);
  const auto seen = ddp::fix_malloc_thresholds(1.0);
  std::cout << "malloc: " << seen.reason << std::endl;
  EXPECT_OR_FAIL(seen.applied, seen.reason);
  const char* env = std::getenv("DDP_MALLOC_MMAP_THRESHOLD_MB");
  const bool env_auto = env && std::string(env) == "-1";
  const bool env_off = env && std::string(env) == "0";
  const bool tuned = large && !env_off && (automatic || env_auto);
  const std::size_t expected = tuned ? 2048u * 2048u * 4u : 1024u * 1024u;
  EXPECT_OR_FAIL(seen.mmap_threshold == expected, "threshold " + std::to_string(seen.mmap_threshold) + ", expected " +
                                                      std::to_string(expected));
  EXPECT_OR_FAIL(seen.trim_threshold == 2 * expected, "trim threshold twice the mmap threshold");
  return 0;
}

// DDPOptions::retain_step_memory: a small CPU model whose gradients are
// bucket views, trained for some steps; after the first steps, a step must
// not fault its memory in again (glibc returning the heap's top every step
// was the small-model slow regime). The step's heap spans about 14 MiB, 3,500
// pages; a step that keeps it takes a few dozen faults at most.
int scenario_step_memory(std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const bool retain = flags["--retain"] != "0";
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5).padding(2)), torch::nn::Sigmoid(),
                            torch::nn::AvgPool2d(2), torch::nn::Flatten(), torch::nn::Linear(8 * 14 * 14, 10));
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().retain_step_memory(retain));
  torch::optim::SGD opt(net->parameters(), 0.01);
  torch::manual_seed(10 + pg->rank());
  const auto x = torch::randn({96, 1, 28, 28});
  const auto y = torch::randint(0, 10, {96}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(x), y).backward();
    opt.step();
  };
  // This thread's faults: the steps' memory is the main thread's; Gloo's
  // threads fault in their own buffers now and then.
  auto faults = [] {
    rusage ru{};
    getrusage(RUSAGE_THREAD, &ru);
    return static_cast<long>(ru.ru_minflt);
  };
  for (int i = 0; i < 4; ++i) step();
  constexpr int kSteps = 20;
  const long before = faults();
  for (int i = 0; i < kSteps; ++i) step();
  const double per_step = static_cast<double>(faults() - before) / kSteps;
  std::cout << "rank " << pg->rank() << ": " << per_step << " page faults per step (retain_step_memory "
            << retain << ")" << std::endl;
  if (retain)
    EXPECT_OR_FAIL(per_step < 150,
                   "a step faults its memory in again: " + std::to_string(per_step) + " page faults per step");
  return 0;
}

// Rank 1 never joins rank 0's all-reduce: rank 0's wait must fail within
// the group's timeout (--timeout) with an error naming the rank, the
// operation and what to do, instead of hanging.
int scenario_straggler(ddp::ProcessGroup& pg) {
  if (pg.rank() != 0) {
    std::cout << "rank " << pg.rank() << ": not joining" << std::endl;
    return 0;
  }
  auto t = torch::ones({16});
  try {
    pg.allreduce(t).wait();
  } catch (const ddp::CommError& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("rank 0") != std::string::npos, "names the rank");
    EXPECT_OR_FAIL(what.find("allreduce") != std::string::npos, "names the operation");
    EXPECT_OR_FAIL(what.find("timeout") != std::string::npos, "says what to do");
    return 0;
  }
  throw Fail("an all-reduce that rank 1 never joined completed");
}

// A rank's end (tests/support/rank_fork.cpp ends a forked one itself): an
// atexit handler and a function-local static that main registered both run,
// last first, when main returns or calls exit(--exit), each appending a
// line to <DDP_TEST_DIR>/rank<r>.atexit.
std::string g_exit_note;
void note_exit(const char* what) {
  std::ofstream(g_exit_note, std::ios::app) << what << "\n";
}
struct NotedAtDestruction {
  ~NotedAtDestruction() { note_exit("static"); }
};

int scenario_exit_handlers(ddp::ProcessGroup& pg, std::map<std::string, std::string> flags) {
  g_exit_note = std::string(std::getenv("DDP_TEST_DIR")) + "/rank" + std::to_string(pg.rank()) + ".atexit";
  static NotedAtDestruction made_in_main;
  std::atexit([] { note_exit("atexit"); });
  pg.barrier();
  if (flags.count("--exit")) std::exit(std::stoi(flags["--exit"]));
  return 0;
}

// This file's scenarios; the other files add theirs (worker_common.h).
const AddScenarios kDdpWorkerScenarios{
    {"grads", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_grads(*pg, pg, flags); }},
    {"batchnorm", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags&) { return scenario_batchnorm(*pg, pg); }},
    {"unused", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_unused(*pg, pg, flags); }},
    {"no_sync", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_no_sync(*pg, pg, flags); }},
    {"mismatch",
     [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_mismatch(*pg, pg, flags); }},
    {"malloc", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_malloc(pg, flags); }},
    {"step_memory",
     [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_step_memory(pg, flags); }},
    {"straggler", [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags&) { return scenario_straggler(*pg); }},
    {"exit_handlers",
     [](std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) { return scenario_exit_handlers(*pg, flags); }}};

// One scenario on the group: its exit code.
int run_scenario(const std::string& scenario, std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags) {
  const auto it = scenario_table().find(scenario);
  if (it == scenario_table().end()) throw Fail("unknown scenario " + scenario + " (not in this build of ddp_worker)");
  return it->second(std::move(pg), flags);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddp_worker SCENARIO [--flag value ...] [--then SCENARIO [--flag value ...]]...\n";
    return 2;
  }
  const auto runs = parse_runs(argc, argv);
  try {
    int timeout_s = 0;  // the longest any run asks for, else 120
    for (const auto& [scenario, flags] : runs)
      if (flags.count("--timeout")) timeout_s = std::max(timeout_s, std::stoi(flags.at("--timeout")));
    const auto timeout = std::chrono::seconds(timeout_s > 0 ? timeout_s : 120);
    // Gloo unless the test asks for another backend (the MPI tests: mpi).
    const char* backend = std::getenv("DDP_TEST_BACKEND");
    auto pg = ddp::init_process_group(
        ddp::ProcessGroupOptions().backend(backend && *backend ? backend : "gloo").timeout(timeout));
    EXPECT_OR_FAIL(!backend || !*backend || pg->backend_name() == backend, "the group is " + pg->backend_name());
    int rc = 0;
    for (size_t k = 0; k < runs.size() && rc == 0; ++k) {
      if (runs.size() > 1) {
        if (k > 0) pg->barrier();
        std::cerr << "scenario " << k + 1 << " of " << runs.size() << ": " << runs[k].first << std::endl;
      }
      rc = run_scenario(runs[k].first, pg, runs[k].second);
    }
    ddp::destroy_process_group();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "FAILED: " << e.what() << std::endl;
    return 1;
  }
}
