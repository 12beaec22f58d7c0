// One rank of the data layer's multi-process tests (started through
// tests/support/multiprocess.h). Exits 0 when its checks hold, 1 with a message
// otherwise. The scenario is argv[1].
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "ddp/train.h"

namespace {

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define CHECK_OR_FAIL(cond, msg)                                                              \
  do {                                                                                        \
    if (!(cond)) throw Fail(std::string("check failed: ") + #cond + ": " + std::string(msg)); \
  } while (0)

// Rank-local evaluation + one all-reduce equals single-process evaluation,
// for a data set that does not divide by the world size.
void scenario_eval(ddp::ProcessGroup& pg) {
  const int64_t n = 103;
  torch::manual_seed(11);
  auto x = torch::randn({n, 6});
  auto y = torch::randint(0, 4, {n}, torch::kLong);
  auto net = torch::nn::Linear(6, 4);
  ddp::TensorDataset data(x, y);
  ddp::DistributedSampler sampler(n, pg, ddp::DistributedSamplerOptions().shuffle(false).pad(false));
  auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(8));
  const auto result = ddp::evaluate_classifier(net, *loader, pg);

  torch::NoGradGuard g;
  auto logits = net->forward(x);
  const double loss_sum =
      torch::nn::functional::cross_entropy(logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
          .item<double>();
  const int64_t correct = logits.argmax(1).eq(y).sum().item<int64_t>();
  std::cout << "rank " << pg.rank() << ": local " << sampler.num_samples() << " samples; global count " << result.count
            << " correct " << result.correct << " (single process " << correct << ") loss " << result.loss()
            << " (single process " << loss_sum / n << ")" << std::endl;
  CHECK_OR_FAIL(result.count == n, "every sample counted once");
  CHECK_OR_FAIL(result.correct == correct, "accuracy equals single-process");
  CHECK_OR_FAIL(std::abs(result.loss_sum - loss_sum) < 1e-4 * std::abs(loss_sum), "loss equals single-process");
  CHECK_OR_FAIL(net->is_training(), "the module is back in training mode");
  // The training sampler pads: counting with it would count some samples twice.
  ddp::DistributedSampler padded(n, pg);
  CHECK_OR_FAIL(padded.total_size() > static_cast<size_t>(n) || n % pg.size() == 0, "padding repeats samples");
}

// ddp::evaluate with ddp::MetricSums for a sequence model: per-token sums
// over uneven shards (37 sequences over 2 or 3 ranks), reduced in one
// all-reduce, give every rank the single-process means; a rank that adds
// nothing still takes part; the module's mode comes back, also after a throw.
void scenario_metric_sums(ddp::ProcessGroup& pg) {
  const int64_t n = 37, len = 5, vocab = 11;
  torch::manual_seed(13);
  auto tokens = torch::randint(0, vocab, {n, len + 1}, torch::kLong);
  auto x = tokens.narrow(1, 0, len).contiguous(), y = tokens.narrow(1, 1, len).contiguous();
  torch::nn::Sequential net(torch::nn::Embedding(vocab, 8), torch::nn::Linear(8, vocab));
  ddp::TensorDataset data(x, y);
  ddp::DistributedSampler sampler(n, pg, ddp::DistributedSamplerOptions().shuffle(false).pad(false));
  auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(4));
  namespace F = torch::nn::functional;
  const auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
  auto measure = [&](torch::data::Example<>& b, ddp::MetricSums& sums) {
    CHECK_OR_FAIL(!net->is_training() && !torch::GradMode::is_enabled(), "eval mode, no gradients");
    auto logits = net->forward(b.data);
    sums.add("loss", F::cross_entropy(logits.flatten(0, 1), b.target.flatten(), sum).item<double>());
    sums.add("correct", logits.argmax(-1).eq(b.target).sum().item<double>());
    sums.add_count(b.target.numel());
  };
  const auto total = ddp::evaluate(net, *loader, pg, {"loss", "correct"}, measure);

  torch::NoGradGuard g;
  auto logits = net->forward(x);
  const double loss = F::cross_entropy(logits.flatten(0, 1), y.flatten()).item<double>();
  const double acc = logits.argmax(-1).eq(y).sum().item<double>() / static_cast<double>(n * len);
  std::cout << "rank " << pg.rank() << ": " << sampler.num_samples() << " of " << n << " sequences; global mean loss "
            << total.mean("loss") << " (single process " << loss << "), tokens " << total.count() << std::endl;
  CHECK_OR_FAIL(total.count() == n * len, "every token counted once");
  CHECK_OR_FAIL(std::abs(total.mean("loss") - loss) < 1e-6 * loss, "the mean loss equals single-process");
  CHECK_OR_FAIL(std::abs(total.mean("correct") - acc) < 1e-12, "the accuracy equals single-process");
  CHECK_OR_FAIL(net->is_training(), "the module is back in training mode");

  // max_batches: one batch of 4 sequences a rank.
  const auto one = ddp::evaluate(net, *loader, pg, {"loss", "correct"}, measure, 1);
  CHECK_OR_FAIL(one.count() == 4 * len * pg.size(), "max_batches caps every rank's batches");

  // Only rank 0 measured anything: every rank still gets its sums.
  ddp::MetricSums mine({"a", "b"});
  if (pg.rank() == 0) {
    mine.add("b", 2.5);
    mine.add_count(2);
  }
  const auto reduced = mine.all_reduced(pg);
  CHECK_OR_FAIL(reduced.sum("a") == 0 && reduced.sum("b") == 2.5 && reduced.mean("b") == 1.25, "rank 0's sums");
  CHECK_OR_FAIL(ddp::MetricSums({"a"}).mean("a") == 0, "a mean over nothing is 0");
  bool threw = false;
  try {
    mine.add("c", 1);
  } catch (const ddp::UsageError& e) {
    threw = std::string(e.what()).find("'c' was not declared") != std::string::npos;
  }
  CHECK_OR_FAIL(threw, "an undeclared name is a UsageError naming it");
  try {
    ddp::evaluate(net, *loader, pg, {"loss"}, [](auto&, ddp::MetricSums& s) { s.add("oops", 1); });
  } catch (const ddp::UsageError&) {
  }
  CHECK_OR_FAIL(net->is_training(), "the module is back in training mode after a throw");
}

// Rank 0 writes, every rank restores the same state; a failed write on rank 0
// is an error on every rank, not a hang.
void scenario_checkpoint(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr, const std::string& dir) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  ddp::DistributedDataParallel model(net, pg_ptr);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step * 10 + pg.rank());
    opt.zero_grad();
    model(torch::randn({5, 4})).pow(2).mean().backward();
    opt.step();
  }
  ddp::TrainState state;
  state.epoch = 1;
  state.step = 3;
  const std::string path = dir + "/checkpoint.pt";
  ddp::save_checkpoint(path, *net, opt, state, pg);
  CHECK_OR_FAIL(std::filesystem::exists(path), "the checkpoint is on disk when save_checkpoint returns");

  torch::manual_seed(77 + pg.rank());
  torch::nn::Sequential other(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto restored = ddp::load_checkpoint(path, *other, &other_opt, pg);
  CHECK_OR_FAIL(restored.step == 3 && restored.world_size == pg.size(), "the training state");
  for (auto& p : net->named_parameters())
    CHECK_OR_FAIL(torch::equal(p.value(), other->named_parameters()[p.key()]), p.key());

  try {
    ddp::save_checkpoint("/proc/no/such/dir/checkpoint.pt", *net, opt, state, pg);
  } catch (const ddp::CheckpointError& e) {
    std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    CHECK_OR_FAIL(what.find("rank " + std::to_string(pg.rank())) == 0, "names this rank");
    if (pg.rank() != 0) CHECK_OR_FAIL(what.find("rank 0 failed") != std::string::npos, "says rank 0 failed");
    return;
  }
  throw Fail("writing to an impossible path did not fail");
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ddp::CheckpointWriter: the file written in the background is
// save_checkpoint's, byte for byte, and holds the state of the call while
// training goes on (Adam's moments and the parameters change meanwhile); a
// write that fails is a CheckpointError at the next wait() or save(), on
// every rank, naming the file, and the writer goes on after it.
void scenario_async_checkpoint(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                               const std::string& dir) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(4, 64), torch::nn::ReLU(), torch::nn::Linear(64, 2));
  ddp::DistributedDataParallel model(net, pg_ptr);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.01));
  auto step = [&](int i) {
    torch::manual_seed(100 + i * 10 + pg.rank());
    opt.zero_grad();
    model(torch::randn({5, 4})).pow(2).mean().backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step(i);
  ddp::TrainState state;
  state.epoch = 1;
  state.step = 3;
  ddp::save_checkpoint(dir + "/sync.pt", *net, opt, state, pg);
  ddp::CheckpointWriter writer(pg);
  writer.save(dir + "/async.pt", *net, opt, state);
  CHECK_OR_FAIL(writer.busy(), "a save's verdict is still to come");
  for (int i = 3; i < 6; ++i) step(i);  // training goes on while it writes
  writer.wait();
  CHECK_OR_FAIL(!writer.busy(), "the verdict came");
  if (pg.rank() == 0) {
    const std::string sync = file_bytes(dir + "/sync.pt"), async = file_bytes(dir + "/async.pt");
    CHECK_OR_FAIL(!sync.empty() && sync == async, "the background file is save_checkpoint's, byte for byte");
  }

  const std::string bad = "/proc/no/such/dir/checkpoint.pt";
  for (const bool at_save : {false, true}) {
    writer.save(bad, *net, opt, state);
    try {
      if (at_save) writer.save(dir + "/async.pt", *net, opt, state);
      else writer.wait();
      throw Fail("a write to an impossible path did not fail");
    } catch (const ddp::CheckpointError& e) {
      const std::string what = e.what();
      std::cout << "caught: " << what << std::endl;
      CHECK_OR_FAIL(what.find("rank " + std::to_string(pg.rank())) == 0, "names this rank");
      CHECK_OR_FAIL(what.find(bad) != std::string::npos, "names the file");
      if (pg.rank() != 0) CHECK_OR_FAIL(what.find("rank 0 failed") != std::string::npos, "says rank 0 failed");
    }
  }
  writer.save(dir + "/async.pt", *net, opt, state);  // and goes on
  writer.wait();

  // Sharded: every rank writes its part of a folder; a part that cannot be
  // written (no such folder, a link planted in the folder's place) fails the
  // save on every rank, naming the folder, and leaves the save before it.
  ddp::CheckpointWriter sharded(pg, ddp::CheckpointLayout::sharded);
  sharded.save(dir + "/sharded", *net, opt, state);
  for (int i = 6; i < 8; ++i) step(i);
  sharded.wait();
  if (pg.rank() == 0) std::filesystem::create_directory_symlink(dir, dir + "/linked");
  pg.barrier();
  for (const std::string& bad_dir : {std::string("/proc/no/such/dir/sharded"), dir + "/linked"}) {
    sharded.save(bad_dir, *net, opt, state);
    try {
      sharded.wait();
      throw Fail("a sharded save into " + bad_dir + " did not fail");
    } catch (const ddp::CheckpointError& e) {
      const std::string what = e.what();
      std::cout << "caught: " << what << std::endl;
      CHECK_OR_FAIL(what.find("rank " + std::to_string(pg.rank())) == 0, "names this rank");
      CHECK_OR_FAIL(what.find(bad_dir) != std::string::npos, "names the folder");
    }
  }
  torch::nn::Sequential again(torch::nn::Linear(4, 64), torch::nn::ReLU(), torch::nn::Linear(64, 2));
  torch::optim::Adam again_opt(again->parameters(), torch::optim::AdamOptions(0.01));
  CHECK_OR_FAIL(ddp::load_checkpoint(dir + "/sharded", *again, &again_opt, pg).step == 3, "the save before loads");
}

// One process saving in the background again and again while it trains, for
// a test to SIGKILL at any moment: at its start it first loads what the last
// one left (load_checkpoint takes the previous file where the newest is torn,
// and says so), counting its saves in DIR/saves.
void scenario_async_checkpoint_loop(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                                    const std::string& dir, int saves) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(256, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 256));
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.001));
  // CHECKPOINT_LAYOUT=sharded: a folder, which every rank writes its part of.
  const char* layout = std::getenv("CHECKPOINT_LAYOUT");
  const bool sharded = layout && std::string(layout) == "sharded";
  const std::string path = dir + (sharded ? "/checkpoint" : "/checkpoint.pt");
  ddp::TrainState state;
  if (std::filesystem::exists(sharded ? path + "/manifest.pt" : path)) {
    state = ddp::load_checkpoint(path, *net, &opt, pg);
    std::cout << "loaded step " << state.step << " from " << state.last_checkpoint << std::endl;
  }
  ddp::CheckpointWriter writer(pg, sharded ? ddp::CheckpointLayout::sharded : ddp::CheckpointLayout::single_file);
  for (int i = 0; i < saves; ++i) {
    opt.zero_grad();
    net->forward(torch::randn({32, 256})).pow(2).mean().backward();
    opt.step();
    ++state.step;
    writer.save(path, *net, opt, state);
    std::ofstream(dir + "/saves", std::ios::app) << state.step << "\n";
  }
  writer.wait();
}

// A ZeRO optimizer in a checkpoint: save_checkpoint consolidates it, and a
// fresh model and ZeRO optimizer loaded from it hold this rank's share of
// the state bitwise and train on exactly as the original does.
void scenario_zero_checkpoint(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                              const std::string& dir) {
  auto make = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8),
                                 torch::nn::ReLU(), torch::nn::Linear(8, 2));
  };
  auto step = [&](torch::nn::Sequential& net, torch::optim::Optimizer& opt, int i) {
    torch::manual_seed(100 + i);  // the same batch on every rank: no DDP needed for equal gradients
    opt.zero_grad();
    net->forward(torch::randn({6, 4})).pow(2).mean().backward();
    opt.step();
  };
  auto net = make();
  ddp::ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(0.01), pg_ptr);
  for (int i = 0; i < 3; ++i) step(net, opt, i);
  ddp::TrainState state;
  state.step = 3;
  const std::string path = dir + "/zero_checkpoint.pt";
  ddp::save_checkpoint(path, *net, opt, state, pg);

  auto other = make();
  ddp::ZeroRedundancyOptimizer other_opt(other->parameters(), torch::optim::AdamOptions(0.01), pg_ptr);
  ddp::load_checkpoint(path, *other, &other_opt, pg);
  CHECK_OR_FAIL(other_opt.local_optimizer().state().size() == opt.local_optimizer().state().size(),
                "this rank's share of the state after loading");
  for (int i = 3; i < 6; ++i) {
    step(net, opt, i);
    step(other, other_opt, i);
  }
  for (auto& p : net->named_parameters())
    CHECK_OR_FAIL(torch::equal(p.value(), other->named_parameters()[p.key()]),
                  p.key() + " differs after 3 more steps from the resumed ZeRO optimizer");
}

// The loss turns NaN on rank `bad_rank` at step `bad_step` (4 steps an
// epoch, a checkpoint after each): with "stop" every rank throws
// NonFiniteLoss at the same step naming that rank and step, and the newest
// checkpoint is the last good one; with "continue" the run ends.
void scenario_nonfinite(ddp::ProcessGroup& pg, std::shared_ptr<ddp::ProcessGroup> pg_ptr, const std::string& dir,
                        int bad_rank, int64_t bad_step, int64_t check_every, const std::string& mode) {
  torch::manual_seed(3);
  auto x = torch::randn({64, 4}), y = torch::randn({64, 2});
  torch::nn::Linear net(4, 2);
  ddp::DistributedDataParallel model(net, pg_ptr);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01));
  const auto opts = ddp::TrainOptions().epochs(3).run_dir(dir).preemption_check_every(check_every).nonfinite_loss(mode);
  ddp::RunDir run(dir, pg, "loss");
  ddp::TensorDataset data(x, y);
  ddp::DistributedSampler sampler(64, pg);
  auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(8));
  ddp::TrainState state;
  run.start(0);
  int64_t epoch = 0;
  try {
    for (; epoch < opts.epochs(); ++epoch) {
      const auto train = ddp::train_epoch(*loader, sampler, epoch, 8, opts, state, pg, [&](auto& b) {
        opt.zero_grad();
        auto loss = (model(b.data) - b.target).pow(2).mean();
        loss.backward();
        opt.step();
        if (pg.rank() == bad_rank && state.step + 1 == bad_step) return loss.detach() * std::nan("");
        return loss.detach();
      });
      ddp::end_epoch(epoch, train, 0, 0, "ok", *net, opt, opts, state, run, pg);
    }
  } catch (const ddp::NonFiniteLoss& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    CHECK_OR_FAIL(mode == "stop", "continue does not throw");
    CHECK_OR_FAIL(what.find("rank " + std::to_string(pg.rank())) == 0, "names this rank first");
    CHECK_OR_FAIL(what.find("nan on rank " + std::to_string(bad_rank) + " at step " + std::to_string(bad_step)) !=
                      std::string::npos, "names the rank and step");
    const int64_t good = (bad_step - 1) / 4;
    CHECK_OR_FAIL(epoch == good, "stopped in the epoch of the bad step");
    if (good > 0) {
      CHECK_OR_FAIL(what.find("last good checkpoint is " + run.checkpoint_path() + " (after epoch " +
                              std::to_string(good) + ")") != std::string::npos, "names the last good checkpoint");
      torch::nn::Linear other(4, 2);
      auto restored = ddp::load_checkpoint(run.checkpoint_path(), *other, nullptr, pg);
      CHECK_OR_FAIL(restored.epoch == good, "no checkpoint after the bad step");
      CHECK_OR_FAIL(torch::isfinite(other->weight).all().item<bool>(), "the checkpoint's weights are finite");
    }
    return;
  }
  CHECK_OR_FAIL(mode == "continue", "stop mode stopped");
  CHECK_OR_FAIL(state.epoch == 3, "continue trains every epoch");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddp_data_worker SCENARIO\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(60)));
    const char* dir = std::getenv("DDP_TEST_DIR");
    if (scenario == "eval") scenario_eval(*pg);
    else if (scenario == "metric_sums") scenario_metric_sums(*pg);
    else if (scenario == "checkpoint") scenario_checkpoint(*pg, pg, dir ? dir : "/tmp");
    else if (scenario == "zero_checkpoint") scenario_zero_checkpoint(*pg, pg, dir ? dir : "/tmp");
    else if (scenario == "async_checkpoint") scenario_async_checkpoint(*pg, pg, dir ? dir : "/tmp");
    else if (scenario == "async_checkpoint_loop" && argc == 3)
      scenario_async_checkpoint_loop(*pg, pg, dir ? dir : "/tmp", std::atoi(argv[2]));
    else if (scenario == "nonfinite" && argc == 6)
      scenario_nonfinite(*pg, pg, dir ? dir : "/tmp", std::atoi(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), argv[5]);
    else throw Fail("unknown scenario " + scenario);
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "FAILED: " << e.what() << std::endl;
    return 1;
  }
}
