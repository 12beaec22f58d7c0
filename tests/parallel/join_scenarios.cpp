// ddp::Join's scenarios of ddp_worker: the models, data and optimizer of
// pytorch_join_parity.py on uneven inputs, case by case, trained by libddp;
// throw_on_early_termination; and uneven inputs without Join.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include "../support/fake_process_group.h"
#include "../support/worker_common.h"

namespace ddp::testing {
namespace {

// The cases of pytorch_join_parity.py: change both together.
struct JoinCase {
  std::string variant;  // plain, reversed (registered in the order gradients are ready), extra, batchnorm
  bool as_view;
  bool small_buckets;
  std::string hook;  // allreduce, fp16 or none
};
const std::map<std::string, JoinCase>& join_cases() {
  static const std::map<std::string, JoinCase> cases = {
      {"default", {"plain", false, false, ""}},     {"buckets", {"reversed", true, true, ""}},
      {"no_divide", {"plain", false, true, ""}},    {"find_unused", {"extra", false, true, ""}},
      {"no_sync", {"plain", true, true, ""}},       {"batchnorm", {"batchnorm", false, true, ""}},
      {"hook_allreduce", {"plain", false, true, "allreduce"}}, {"hook_fp16", {"plain", true, true, "fp16"}},
      {"early_join", {"reversed", false, true, ""}}, {"disabled", {"plain", false, true, ""}},
      {"static", {"reversed", true, true, ""}},
  };
  return cases;
}

constexpr int kRows = 8;

struct JoinNetImpl : torch::nn::Module {
  explicit JoinNetImpl(const std::string& variant) : variant(variant) {
    if (variant == "reversed") {
      l3 = register_module("l3", torch::nn::Linear(16, 3));
      l2 = register_module("l2", torch::nn::Linear(16, 16));
      l1 = register_module("l1", torch::nn::Linear(6, 16));
    } else {
      l1 = register_module("l1", torch::nn::Linear(6, 16));
      if (variant == "batchnorm") bn = register_module("bn", torch::nn::BatchNorm1d(16));
      l2 = register_module("l2", torch::nn::Linear(16, 16));
      l3 = register_module("l3", torch::nn::Linear(16, 3));
      if (variant == "extra") extra = register_module("extra", torch::nn::Linear(6, 3));
    }
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    auto h = l1(x);
    if (bn) h = bn(h);
    h = torch::tanh(l2(torch::tanh(h)));
    auto y = l3(h);
    if (use_extra) y = y + extra(x);
    return y;
  }
  std::string variant;
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, extra{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(JoinNet);

JoinNet plain_net() {
  JoinNet net("plain");
  init_parity_parameters(*net);
  return net;
}

// Rank `rank`'s batch `step`: different data on every rank.
std::pair<torch::Tensor, torch::Tensor> join_batch(int step, int rank) {
  auto n = torch::arange(kRows, torch::kDouble).unsqueeze(1);
  auto x = torch::sin(0.1 * (step * 1000 + rank * 100 + n * 7 + torch::arange(6, torch::kDouble).unsqueeze(0) * 3))
               .to(torch::kFloat);
  auto y = torch::cos(0.05 * (step * 500 + rank * 50 + n * 5 + torch::arange(3, torch::kDouble).unsqueeze(0)))
               .to(torch::kFloat);
  return {x, y};
}

std::vector<int> parse_batches(const std::string& list) {
  std::vector<int> out;
  for (const auto& v : split_commas(list)) out.push_back(std::stoi(v));
  return out;
}

// This rank's number of batches in `name` (pytorch_join_parity.py's num_batches).
int num_batches(const std::string& name, const std::vector<int>& batches, int rank) {
  if (name == "disabled") return batches.front();  // even inputs: Join is off
  if (name == "early_join") return rank == 0 ? 1 : rank == 1 ? 3 : 0;
  return batches.at(rank);
}

std::string run_join_case(const std::string& name, const std::vector<int>& batches,
                          std::shared_ptr<ddp::ProcessGroup> pg) {
  const auto& c = join_cases().at(name);
  const int rank = pg->rank();
  JoinNet net(c.variant);
  init_parity_parameters(*net);
  auto options = ddp::DDPOptions()
                     .gradient_as_bucket_view(c.as_view)
                     .find_unused_parameters(name == "find_unused")
                     .static_graph(name == "static");
  if (c.small_buckets) python_small_buckets(options, 512, 1024);
  ddp::DistributedDataParallel model(net, pg, options);
  if (c.hook == "allreduce") model.register_comm_hook(pg, ddp::hooks::allreduce_hook);
  if (c.hook == "fp16") model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int n = num_batches(name, batches, rank);
  {
    ddp::Join join({&model}, ddp::JoinOptions().enable(name != "disabled").divide_by_initial_world_size(name != "no_divide"));
    EXPECT_OR_FAIL(model.join_config().enable == (name != "disabled"), "Join configures the model");
    for (int step = 0; step < n; ++step) {
      auto [x, y] = join_batch(step, rank);
      const bool use_extra = name == "find_unused" && (step % 3 == 0 || (rank == 0 && step % 2 == 0));
      if (name == "no_sync" && step % 2 == 0) {
        auto guard = model.no_sync();
        torch::mse_loss(model(x, use_extra), y).backward();
        continue;
      }
      torch::mse_loss(model(x, use_extra), y).backward();
      opt.step();
      opt.zero_grad();
    }
  }
  EXPECT_OR_FAIL(!model.join_config().enable, "Join's end leaves the model as without Join");
  if (name == "no_divide") {
    // Even steps after the Join divide by the world size again.
    for (int step = 100; step < 102; ++step) {
      auto [x, y] = join_batch(step, rank);
      torch::mse_loss(model(x), y).backward();
      opt.step();
      opt.zero_grad();
    }
  }
  return parity_state_bytes(*net);
}

// 33 samples, batches of 4, DistributedSampler without padding at 2 ranks:
// 17 samples (5 batches) on rank 0, 16 (4 batches) on rank 1.
std::string run_sampler_case(std::shared_ptr<ddp::ProcessGroup> pg) {
  constexpr int kSamples = 33, kBatch = 4;
  auto n = torch::arange(kSamples, torch::kDouble).unsqueeze(1);
  auto xs = torch::sin(0.3 * n + 0.2 * torch::arange(6, torch::kDouble).unsqueeze(0)).to(torch::kFloat);
  auto ys = torch::cos(0.2 * n + 0.5 * torch::arange(3, torch::kDouble).unsqueeze(0)).to(torch::kFloat);
  JoinNet net = plain_net();
  ddp::DistributedDataParallel model(net, pg);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ddp::DistributedSampler sampler(kSamples, *pg, ddp::DistributedSamplerOptions().pad(false).seed(7));
  int batches = 0;
  ddp::join({&model}, [&] {
    for (int epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch);
      sampler.reset();
      while (auto indices = sampler.next(kBatch)) {
        auto idx = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()), torch::kLong);
        opt.zero_grad();
        torch::mse_loss(model(xs.index_select(0, idx)), ys.index_select(0, idx)).backward();
        opt.step();
        ++batches;
      }
    }
  });
  const int expected = pg->rank() == 0 ? 10 : 8;
  EXPECT_OR_FAIL(batches == expected, "rank " + std::to_string(pg->rank()) + " ran " + std::to_string(batches) +
                                          " batches, expected " + std::to_string(expected));
  return parity_state_bytes(*net);
}

// What the scenarios that check Join's behaviour rather than its bits train:
// the plain model under DDP, SGD without momentum, and this rank's number of
// batches from --batches.
struct PlainTraining {
  PlainTraining(std::shared_ptr<ddp::ProcessGroup> pg, const Flags& flags, ddp::DDPOptions options = {})
      : batches(parse_batches(flags.at("--batches"))),
        rank(pg->rank()),
        net(plain_net()),
        model(net, pg, options),
        opt(net->parameters(), 0.05) {}
  int my_batches() const { return batches.at(rank); }
  // One optimizer step on this rank's batch `step`; the loss.
  torch::Tensor step(int step) {
    auto [x, y] = join_batch(step, rank);
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    loss.backward();
    opt.step();
    return loss;
  }
  const std::vector<int> batches;
  const int rank;
  JoinNet net;
  ddp::DistributedDataParallel<JoinNetImpl> model;
  torch::optim::SGD opt;
};

}  // namespace

// Writes <out>/cpp_<case>_rank<r>.bin for every case in --cases.
int scenario_join_parity(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  const auto batches = parse_batches(flags["--batches"]);
  EXPECT_OR_FAIL(static_cast<int>(batches.size()) == pg->size(), "--batches gives one count per rank");
  for (const auto& name : split_commas(flags["--cases"])) {
    const auto bytes = name == "sampler" ? run_sampler_case(pg) : run_join_case(name, batches, pg);
    write_bytes(flags["--out"] + "/cpp_" + name + "_rank" + std::to_string(pg->rank()) + ".bin", bytes);
  }
  return 0;
}

// throw_on_early_termination: the rank that runs out first throws "exhausted
// all inputs" from Join, every other rank "Detected at least one rank" from
// its next forward; all UnevenInputsError.
int scenario_join_throw(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  PlainTraining run(pg, flags);
  const auto& batches = run.batches;
  const int rank = run.rank;
  auto& model = run.model;
  int steps = 0;
  if (flags["--user-throw"] == "1") {
    // The loop throws on every rank: the guard's destructor runs during
    // unwinding, must not shadow (nor throw: that would terminate).
    try {
      ddp::Join join({&model}, ddp::JoinOptions().throw_on_early_termination(true));
      for (int step = 0; step < batches.at(rank); ++step) {
        if (step == 2) throw std::runtime_error("the loop's own error");
        auto [x, y] = join_batch(step, rank);
        torch::mse_loss(model(x), y).backward();
      }
    } catch (const std::runtime_error& e) {
      EXPECT_OR_FAIL(std::string(e.what()) == "the loop's own error", e.what());
      EXPECT_OR_FAIL(!model.join_config().enable, "the guard resets the model during unwinding too");
      std::cout << "rank " << rank << ": the loop's error went through Join" << std::endl;
      return 0;
    }
    throw Fail("the loop's error was lost");
  }
  try {
    ddp::join({&model}, [&] {
      for (int step = 0; step < run.my_batches(); ++step) {
        run.step(step);
        ++steps;
      }
    }, ddp::JoinOptions().throw_on_early_termination(true));
  } catch (const ddp::UnevenInputsError& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    const int fewest = *std::min_element(batches.begin(), batches.end());
    EXPECT_OR_FAIL(what.rfind("rank " + std::to_string(rank) + ":", 0) == 0, "names this rank");
    if (batches[rank] == fewest) {
      EXPECT_OR_FAIL(steps == fewest, "the first rank to run out ran all its batches");
      EXPECT_OR_FAIL(what.find("exhausted all inputs") != std::string::npos, what);
    } else {
      EXPECT_OR_FAIL(steps == fewest, "a rank still training stops at the first forward after the others ran out");
      EXPECT_OR_FAIL(what.find("detected at least one rank that exhausted inputs") != std::string::npos, what);
    }
    EXPECT_OR_FAIL(!model.join_config().enable, "Join's end leaves the model as without Join");
    return 0;
  }
  throw Fail("no UnevenInputsError with throw_on_early_termination");
}

// Join(enable(false)) asks for exactly the collectives of no Join at all;
// an enabled Join on the same even inputs asks for more (its counts and
// flags each forward), and both train alike.
int scenario_join_disabled(std::shared_ptr<ddp::ProcessGroup> pg) {
  auto train = [&](int mode) {  // 0: no Join, 1: Join(enable(false)), 2: Join
    auto counting = std::make_shared<CountingGroup>(pg);
    JoinNet net = plain_net();  // BatchNorm's buffers would follow the highest rank under Join, rank 0 without
    ddp::DistributedDataParallel model(net, counting, tiny_buckets());
    torch::optim::SGD opt(net->parameters(), 0.05);
    const int64_t before = counting->counts().allreduces + counting->counts().broadcasts;
    auto loop = [&] {
      for (int step = 0; step < 4; ++step) {
        auto [x, y] = join_batch(step, pg->rank());
        opt.zero_grad();
        torch::mse_loss(model(x), y).backward();
        opt.step();
      }
    };
    if (mode == 0) loop();
    else ddp::join({&model}, loop, ddp::JoinOptions().enable(mode == 2));
    return std::make_pair(counting->counts().allreduces + counting->counts().broadcasts - before, parity_state_bytes(*net));
  };
  const auto plain = train(0), disabled = train(1), enabled = train(2);
  std::cout << "rank " << pg->rank() << ": collectives without Join " << plain.first << ", Join(enable(false)) "
            << disabled.first << ", Join " << enabled.first << std::endl;
  EXPECT_OR_FAIL(disabled.first == plain.first, "Join(enable(false)) changed the collectives");
  EXPECT_OR_FAIL(enabled.first > plain.first, "an enabled Join added no collective");
  EXPECT_OR_FAIL(disabled.second == plain.second && enabled.second == plain.second,
                 "even inputs train alike with and without Join");
  return 0;
}

// A Joinable of the user's own beside DDP, as a sharded optimizer would be:
// a running loss sum all-reduced once per iteration. Joined ranks answer with
// zeros, so every rank ends with the sum over every batch of every rank.
class LossMeter : public ddp::Joinable {
 public:
  explicit LossMeter(std::shared_ptr<ddp::ProcessGroup> pg) : pg_(std::move(pg)) {}
  void add(double loss) {
    ddp::Join::notify_join_context(*this);  // not Join's first joinable: nothing to do, as PyTorch
    auto t = torch::tensor({loss, 1.0}, torch::kDouble);
    pg_->allreduce(t).wait();
    total += t[0].item<double>();
    count += static_cast<int64_t>(t[1].item<double>());
  }
  std::unique_ptr<ddp::JoinHook> join_hook(const ddp::JoinOptions&) override {
    struct Hook : ddp::JoinHook {
      LossMeter& meter;
      explicit Hook(LossMeter& m) : meter(m) {}
      void main_hook() override {
        auto zeros = torch::zeros({2}, torch::kDouble);
        meter.pg_->allreduce(zeros).wait();
        meter.total += zeros[0].item<double>();
        meter.count += static_cast<int64_t>(zeros[1].item<double>());
      }
    };
    return std::make_unique<Hook>(*this);
  }
  ddp::ProcessGroup& join_process_group() override { return *pg_; }
  double total = 0;
  int64_t count = 0;

 private:
  std::shared_ptr<ddp::ProcessGroup> pg_;
};

int scenario_join_custom(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  PlainTraining run(pg, flags, tiny_buckets());
  const auto& batches = run.batches;
  const int rank = run.rank;
  auto& model = run.model;
  auto& net = run.net;
  LossMeter meter(pg);
  double mine = 0;
  ddp::join({&model, &meter}, [&] {
    for (int step = 0; step < run.my_batches(); ++step) {
      const double loss = run.step(step).item<double>();
      mine += loss;
      meter.add(loss);
    }
  });
  EXPECT_OR_FAIL(!meter.join_config().enable && !model.join_config().enable, "Join's end resets every joinable");
  auto all = pg->allgather(torch::tensor({mine}, torch::kDouble));
  double expected = 0;
  for (const auto& t : all) expected += t.item<double>();
  int64_t expected_count = 0;
  for (int b : batches) expected_count += b;
  std::cout << "rank " << rank << ": meter " << meter.total << " over " << meter.count << " batches, expected "
            << expected << " over " << expected_count << std::endl;
  EXPECT_OR_FAIL(meter.count == expected_count, "the meter counted every batch of every rank");
  EXPECT_OR_FAIL(std::abs(meter.total - expected) < 1e-9 * std::max(1.0, std::abs(expected)), "the meter's sum");
  expect_same_across_ranks(*pg, net->parameters(), "parameters after Join");
  return 0;
}

// Uneven inputs without Join: the early rank leaves (--after exit) or waits
// in a barrier (--after barrier); the others' next collective fails, with an
// error that names the rank and says to use ddp::Join or even batches.
// Exits non-zero through main's handler.
int scenario_join_missing(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  PlainTraining run(pg, flags);
  const int rank = run.rank;
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int step = 0; step < run.my_batches(); ++step) run.step(step);
    if (flags["--after"] == "barrier") pg->barrier();
  } catch (...) {
    std::cout << "rank " << rank << ": failed after "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s" << std::endl;
    throw;
  }
  std::cout << "rank " << rank << ": done with " << run.my_batches() << " batches" << std::endl;
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kJoinScenarios{
    {"join_parity", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_join_parity(pg, flags); }},
    {"join_throw", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_join_throw(pg, flags); }},
    {"join_disabled", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_join_disabled(pg); }},
    {"join_custom", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_join_custom(pg, flags); }},
    {"join_missing", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_join_missing(pg, flags); }}};

}  // namespace ddp::testing
