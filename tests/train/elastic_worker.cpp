// One rank of the elastic-resume tests (elastic_resume_test.cpp): a job
// stopped at one world size and resumed at another. argv[1] is the
// scenario:
//
//   train [training options]   a tiny model over 50 samples whose first
//       column is the sample's index; every index a step trains on is
//       appended to <run-dir>/indices.<ELASTIC_TAG>.<rank> as "epoch index".
//       Rank STOP_RANK raises signal STOP_SIGNAL to itself during its
//       STOP_AT_STEP-th step (counted from this process's start), after its
//       backward and before the optimizer's step. Under ddprun
//       --recover-in-process the group is a recoverable one
//       (recovery_kit_test.cpp); ELASTIC_STEP_MS pauses every step while the
//       group is smaller than WORLD_SIZE (time for a replacement to start).
//       STOP_NODE=1: the rank SIGKILLs its ddprun first (its node is lost).
//       STOP_IN_EVAL=E: the rank stops instead in epoch E's evaluation (a
//       mean squared error over the data set, each rank its shard), at
//       its first batch. Each epoch's line says "eval N samples".
//       RUN_DIR_PER_RANK=1: rank r's run folder is <run-dir>/node<r>, as
//       on nodes that do not share a file system.
//   zero_save / zero_load      a ZeRO optimizer's checkpoint written at one
//       world size and loaded at another (DDP_TEST_DIR/zero.pt).
//   sharded_save / sharded_load   plain Adam and ZeRO over Adam saved at
//       one world size both as one consolidated file and as a sharded
//       checkpoint (DDP_TEST_DIR/plain, /zero), loaded at another: both
//       give the same parameters and optimizer state, bitwise, and train on
//       alike; the folder exported to one file does too.
//   zero_train [training options]   ZeRO in an elastic job under ddprun
//       (tests/launcher/netns_elastic_test.cpp): on a resume at another world
//       size, each rank's share is checked against a fresh load.
//
// Exit status: guarded_main's (0, 1, 75 when stopped for preemption).
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "ddp/train.h"
#include "optim/zero_state.h"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

int scenario_train(int argc, char** argv) {
  auto opts = ddp::parse_train_options(argc, argv, ddp::TrainOptions().epochs(2).preemption_check_every(1).lr(0.01));
  auto pg = ddp::recovery_launched() ? opts.init_process_group()
                                     : ddp::init_process_group(opts.process_group_options().backend("gloo"));
  // As on nodes with a run folder each: rank r's is <run-dir>/node<r>.
  if (env_int("RUN_DIR_PER_RANK", 0)) {
    opts.run_dir(opts.run_dir() + "/node" + std::to_string(pg->rank()));
    std::filesystem::create_directories(opts.run_dir());
  }
  ddp::RunDir run(opts.run_dir(), *pg, "loss");
  const int64_t n = 50;
  torch::manual_seed(1);
  auto x = torch::cat({torch::arange(n, torch::kFloat).unsqueeze(1), torch::randn({n, 3})}, 1);
  auto y = torch::randn({n, 1});
  ddp::TensorDataset data(x, y);
  ddp::DistributedSampler sampler(n, *pg, ddp::DistributedSamplerOptions().seed(opts.seed()));
  const int64_t batch = opts.per_process_batch(pg->size());
  auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(batch));
  ddp::DistributedSampler eval_sampler(n, *pg, ddp::DistributedSamplerOptions().shuffle(false).pad(false));
  auto eval_loader = torch::data::make_data_loader(data, eval_sampler, torch::data::DataLoaderOptions(batch));
  torch::nn::Linear net(3, 1);
  ddp::DistributedDataParallel model(net, pg);
  // ELASTIC_ZERO=1: SGD with momentum under a ZeroRedundancyOptimizer.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (env_int("ELASTIC_ZERO", 0) == 1)
    optimizer = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(), torch::optim::SGDOptions(opts.lr()).momentum(0.9), pg);
  else
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(opts.lr()));
  auto& opt = *optimizer;
  ddp::TrainState state = ddp::resume_or_start(opts, run, *net, opt, *pg);

  const char* tag = std::getenv("ELASTIC_TAG");
  std::ofstream out(opts.run_dir() + "/indices." + (tag ? tag : "run") + "." + std::to_string(pg->rank()),
                    std::ios::app);
  // A worker started in place of a lost one (DDPRUN_REPLACEMENT) is not stopped again.
  const int stop_signal = env_int("STOP_SIGNAL", 0),
            stop_rank = std::getenv("DDPRUN_REPLACEMENT") ? -1 : env_int("STOP_RANK", -1),
            stop_at = env_int("STOP_AT_STEP", -1), stop_in_eval = env_int("STOP_IN_EVAL", -1);
  auto stop = [&] {
    if (env_int("STOP_NODE", 0) == 1) ::kill(::getppid(), SIGKILL);
    ::raise(stop_signal);
  };
  int steps_here = 0;
  const int pause_ms = env_int("ELASTIC_STEP_MS", 0);
  for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
    const auto train = ddp::train_epoch(*loader, sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
      if (pause_ms > 0 && pg->size() < env_int("WORLD_SIZE", 0))
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      for (int64_t i = 0; i < b.data.size(0); ++i)
        out << epoch << " " << static_cast<int64_t>(b.data[i][0].template item<float>()) << "\n";
      out.flush();
      opt.zero_grad();
      auto loss = (model(b.data.narrow(1, 1, 3)) - b.target).pow(2).mean();
      loss.backward();
      if (++steps_here == stop_at && pg->rank() == stop_rank) stop();
      ddp::optimizer_step(model, opt);
      return loss.detach();
    });
    const auto eval = ddp::evaluate(net, *eval_loader, *pg, {"loss"}, [&](auto& b, ddp::MetricSums& sums) {
      if (epoch == stop_in_eval && pg->rank() == stop_rank) stop();
      sums.add("loss", (net->forward(b.data.narrow(1, 1, 3)) - b.target).pow(2).sum().template item<double>());
      sums.add_count(b.data.size(0));
    });
    ddp::end_epoch(epoch, train, eval.mean("loss"), 0, "eval " + std::to_string(eval.count()) + " samples", *net, opt,
                   opts, state, run, *pg);
  }
  // The final parameters' bytes, for the comparison across ranks.
  std::ofstream params(opts.run_dir() + "/params." + std::to_string(pg->rank()), std::ios::binary);
  for (const auto& p : net->parameters()) {
    const auto c = p.detach().contiguous();
    params.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  params.close();
  ddp::destroy_process_group();
  return 0;
}

torch::nn::Sequential make_net() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8), torch::nn::ReLU(),
                               torch::nn::Linear(8, 2));
}

// The same batch on every rank: equal gradients without DDP, so a plain
// optimizer on one rank and ZeRO at any world size take the same steps.
void train_step(torch::nn::Sequential& net, torch::optim::Optimizer& opt, int i) {
  torch::manual_seed(100 + i);
  opt.zero_grad();
  net->forward(torch::randn({6, 4})).pow(2).mean().backward();
  opt.step();
}

std::string dir() {
  const char* d = std::getenv("DDP_TEST_DIR");
  return d ? d : "/tmp";
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

int scenario_zero_save() {
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo"));
  auto net = make_net();
  ddp::ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(0.01), pg);
  for (int i = 0; i < 3; ++i) train_step(net, opt, i);
  ddp::TrainState state;
  state.step = 3;
  ddp::save_checkpoint(dir() + "/zero.pt", *net, opt, state, *pg);
  ddp::destroy_process_group();
  return 0;
}

using ddp::zero_state::key_of;

// Adam states of two optimizers over parameters a[i] and b[i], bitwise.
void expect_same_adam_state(torch::optim::Optimizer& x, const std::vector<torch::Tensor>& a, torch::optim::Optimizer& y,
                            const std::vector<torch::Tensor>& b, int rank) {
  check(x.state().size() == y.state().size(), "rank " + std::to_string(rank) + ": as many parameters' states");
  int held = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    auto ix = x.state().find(key_of(x.state(), a[i]));
    auto iy = y.state().find(key_of(y.state(), b[i]));
    const std::string what = "rank " + std::to_string(rank) + " parameter " + std::to_string(i);
    check((ix == x.state().end()) == (iy == y.state().end()), what + ": held by both or neither");
    if (ix == x.state().end()) continue;
    ++held;
    auto& u = dynamic_cast<torch::optim::AdamParamState&>(*ix->second);
    auto& v = dynamic_cast<torch::optim::AdamParamState&>(*iy->second);
    check(u.step() == v.step(), what + ": step");
    check(torch::equal(u.exp_avg(), v.exp_avg()), what + ": exp_avg");
    check(torch::equal(u.exp_avg_sq(), v.exp_avg_sq()), what + ": exp_avg_sq");
  }
  std::cout << "rank " << rank << ": " << held << " parameters' Adam state equal to a fresh load" << std::endl;
}

int scenario_zero_load() {
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo"));
  // Loaded from the checkpoint the other world size wrote.
  auto net = make_net();
  ddp::ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(0.01), pg);
  const auto state = ddp::load_checkpoint(dir() + "/zero.pt", *net, &opt, *pg);
  check(state.world_size != pg->size(), "the checkpoint comes from another world size");

  // A fresh load at this world size of the consolidated state: the plain
  // optimizer's, after the same steps.
  auto plain_net = make_net();
  torch::optim::Adam plain(plain_net->parameters(), torch::optim::AdamOptions(0.01));
  for (int i = 0; i < 3; ++i) train_step(plain_net, plain, i);
  std::ostringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    plain.save(archive);
    archive.save_to(bytes);
  }
  auto fresh_net = make_net();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < fresh_net->parameters().size(); ++i)
      fresh_net->parameters()[i].copy_(plain_net->parameters()[i]);
  }
  ddp::ZeroRedundancyOptimizer fresh(fresh_net->parameters(), torch::optim::AdamOptions(0.01), pg);
  {
    std::istringstream in_bytes(bytes.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in_bytes);
    fresh.load(archive);
  }
  for (size_t i = 0; i < net->parameters().size(); ++i)
    check(torch::equal(net->parameters()[i], fresh_net->parameters()[i]), "parameter " + std::to_string(i));
  expect_same_adam_state(opt.local_optimizer(), net->parameters(), fresh.local_optimizer(), fresh_net->parameters(),
                         pg->rank());
  for (int i = 3; i < 6; ++i) {
    train_step(net, opt, i);
    train_step(fresh_net, fresh, i);
  }
  for (size_t i = 0; i < net->parameters().size(); ++i)
    check(torch::equal(net->parameters()[i], fresh_net->parameters()[i]),
          "parameter " + std::to_string(i) + " after 3 more steps");
  ddp::destroy_process_group();
  return 0;
}

// A model with buffers (the batch norm's running statistics and its int64
// count of batches) beside its parameters.
torch::nn::Sequential make_bn_net() {
  torch::manual_seed(6);
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
}

std::unique_ptr<torch::optim::Optimizer> make_adam(const std::string& kind, torch::nn::Sequential& net,
                                                   std::shared_ptr<ddp::ProcessGroup> pg) {
  if (kind == "zero") return std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), torch::optim::AdamOptions(0.01), pg);
  return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
}

torch::optim::Optimizer& state_of(torch::optim::Optimizer& opt) {
  auto* zero = dynamic_cast<ddp::ZeroRedundancyOptimizer*>(&opt);
  return zero ? zero->local_optimizer() : opt;
}

int scenario_sharded_save() {
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo"));
  for (const std::string kind : {"plain", "zero"}) {
    auto net = make_bn_net();
    auto opt = make_adam(kind, net, pg);
    for (int i = 0; i < 3; ++i) train_step(net, *opt, i);
    ddp::TrainState state;
    state.step = 3;
    state.extra["kind"] = kind;
    ddp::save_checkpoint(dir() + "/" + kind + ".pt", *net, *opt, state, *pg);
    if (kind == "plain") {
      ddp::save_sharded_checkpoint(dir() + "/" + kind, *net, *opt, state, *pg);
      continue;
    }
    // In the background, while training goes on: the state of the call.
    ddp::CheckpointWriter writer(*pg, ddp::CheckpointLayout::sharded);
    writer.save(dir() + "/" + kind, *net, *opt, state);
    for (int i = 3; i < 5; ++i) train_step(net, *opt, i);
    writer.wait();
  }
  ddp::destroy_process_group();
  return 0;
}

void expect_same(torch::nn::Sequential& a, torch::optim::Optimizer& x, torch::nn::Sequential& b,
                 torch::optim::Optimizer& y, int rank, const std::string& what) {
  for (size_t i = 0; i < a->parameters().size(); ++i)
    check(torch::equal(a->parameters()[i], b->parameters()[i]), what + ": parameter " + std::to_string(i));
  for (size_t i = 0; i < a->buffers().size(); ++i)
    check(torch::equal(a->buffers()[i], b->buffers()[i]), what + ": buffer " + std::to_string(i));
  std::cout << what << ": ";
  expect_same_adam_state(state_of(x), a->parameters(), state_of(y), b->parameters(), rank);
}

int scenario_sharded_load() {
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo"));
  for (const std::string kind : {"plain", "zero"}) {
    auto sharded_net = make_bn_net(), file_net = make_bn_net(), exported_net = make_bn_net();
    auto sharded = make_adam(kind, sharded_net, pg), file = make_adam(kind, file_net, pg);
    auto exported = make_adam(kind, exported_net, pg);
    const auto state = ddp::load_checkpoint(dir() + "/" + kind, *sharded_net, sharded.get(), *pg);
    check(state.world_size != pg->size() && state.step == 3, kind + ": the position of another world size");
    check(state.extra.at("kind").toStringRef() == kind, kind + ": the extras");
    ddp::load_checkpoint(dir() + "/" + kind + ".pt", *file_net, file.get(), *pg);
    expect_same(sharded_net, *sharded, file_net, *file, pg->rank(), kind + ", sharded and one file");
    const std::string one = dir() + "/" + kind + ".exported" + std::to_string(pg->size()) + ".pt";
    if (pg->rank() == 0) ddp::export_checkpoint(dir() + "/" + kind, one);
    pg->barrier();
    ddp::load_checkpoint(one, *exported_net, exported.get(), *pg);
    expect_same(exported_net, *exported, file_net, *file, pg->rank(), kind + ", exported and one file");
    for (int i = 3; i < 6; ++i) {
      train_step(sharded_net, *sharded, i);
      train_step(file_net, *file, i);
    }
    expect_same(sharded_net, *sharded, file_net, *file, pg->rank(), kind + ", 3 steps on");
  }
  ddp::destroy_process_group();
  return 0;
}

// An elastic job's ranks under ddprun, with ZeRO: a small model, Adam
// sharded by ddp::ZeroRedundancyOptimizer, the kit's loop and checkpoints
// (STEP_SLEEP_MS per step keeps it running while nodes come and go). A run
// that resumed at another world size first loads the same checkpoint afresh
// into a second ZeRO optimizer at this world size and checks that every
// rank's share is bitwise what resume_or_start gave it: the state after the
// change is a fresh load of the consolidated state.
int scenario_zero_train(int argc, char** argv) {
  const auto opts = ddp::parse_train_options(argc, argv, ddp::TrainOptions().epochs(6).lr(0.01));
  auto pg = ddp::init_process_group(opts.process_group_options().backend("gloo"));
  ddp::RunDir run(opts.run_dir(), *pg, "loss");
  const int64_t n = 480;
  torch::manual_seed(1);
  ddp::TensorDataset data(torch::randn({n, 4}), torch::randn({n, 2}));
  ddp::DistributedSampler sampler(n, *pg, ddp::DistributedSamplerOptions().seed(opts.seed()));
  const int64_t batch = opts.per_process_batch(pg->size());
  auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(batch));
  auto net = make_net();
  ddp::DistributedDataParallel model(net, pg);
  ddp::ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(opts.lr()), pg);
  ddp::TrainState state = ddp::resume_or_start(opts, run, *net, opt, *pg);
  if (!state.last_checkpoint.empty() && state.world_size != pg->size()) {
    auto fresh_net = make_net();
    ddp::ZeroRedundancyOptimizer fresh(fresh_net->parameters(), torch::optim::AdamOptions(opts.lr()), pg);
    ddp::load_checkpoint(state.last_checkpoint, *fresh_net, &fresh, *pg);
    expect_same_adam_state(opt.local_optimizer(), net->parameters(), fresh.local_optimizer(), fresh_net->parameters(),
                           pg->rank());
    std::cout << "zero: rank " << pg->rank() << " of " << pg->size() << " resumed from " << state.world_size
              << " ranks holds a fresh load's share" << std::endl;
  }
  const int sleep_ms = env_int("STEP_SLEEP_MS", 0);
  for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
    const auto train = ddp::train_epoch(*loader, sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
      opt.zero_grad();
      auto loss = (model(b.data) - b.target).pow(2).mean();
      loss.backward();
      opt.step();
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      return loss.detach();
    });
    ddp::end_epoch(epoch, train, 0, 0, "ok", *net, opt, opts, state, run, *pg);
  }
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    const std::string scenario = argc > 1 ? argv[1] : "";
    if (scenario == "train") return scenario_train(argc - 1, argv + 1);
    if (scenario == "zero_save") return scenario_zero_save();
    if (scenario == "zero_load") return scenario_zero_load();
    if (scenario == "sharded_save") return scenario_sharded_save();
    if (scenario == "sharded_load") return scenario_sharded_load();
    if (scenario == "zero_train") return scenario_zero_train(argc - 1, argv + 1);
    throw ddp::UsageError("unknown scenario '" + scenario + "'");
  });
}
