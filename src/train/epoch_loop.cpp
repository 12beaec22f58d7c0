#include "ddp/train/epoch_loop.h"
#include "ddp/comm/recovery.h"

#include "train/epoch_checks.h"
#include "train/kit_checkpoint.h"
#include "train/recovery_glue.h"
#include "train/run_tensorboard.h"

#include "runtime/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "comm/objects/object_exchange.h"
#include "runtime/parse_number.h"

namespace ddp {

namespace detail {

void LossTally::add(const at::Tensor& loss, int64_t samples) {
  torch::NoGradGuard no_grad;
  if (static_cast<int64_t>(pending_samples_.size()) == kPending) read();
  if (!pending_.defined()) pending_ = torch::empty({kPending}, loss.options().dtype(torch::kDouble));
  pending_[static_cast<int64_t>(pending_samples_.size())].copy_(loss.detach().reshape({}));
  pending_samples_.push_back(samples);
}

LossTally::Read LossTally::read() {
  const auto n = static_cast<int64_t>(pending_samples_.size());
  if (n == 0) return read_;
  const auto host = pending_.narrow(0, 0, n).to(torch::kCPU).contiguous();  // one read back
  const double* v = host.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i, ++steps_read_) {
    // loss x samples, then the sum: the arithmetic of a sum kept on the host.
    read_.sum += v[i] * static_cast<double>(pending_samples_[static_cast<size_t>(i)]);
    if (!std::isfinite(v[i]) && read_.nonfinite < 0) {
      read_.nonfinite = steps_read_;
      read_.nonfinite_loss = v[i];
    }
  }
  pending_samples_.clear();
  return read_;
}

void LossTally::forget_nonfinite() {
  read();
  read_.nonfinite = -1;
  read_.nonfinite_loss = 0;
}

bool RankCheck::any_nonfinite() const {
  for (const auto& n : nonfinite)
    if (n.step > 0) return true;
  return false;
}

RankCheck check_ranks(ProcessGroup& pg, bool preempt, const NonFiniteStep& mine) {
  // float64 holds step counts exactly (below 2^53); each rank fills its own
  // four slots, so the sum hands every rank everyone's.
  constexpr int kSlots = 4;
  const int world = pg.size(), rank = pg.rank();
  auto t = torch::zeros({1 + kSlots * world}, torch::kDouble);
  auto a = t.accessor<double, 1>();
  a[0] = preempt ? 1 : 0;
  if (mine.step > 0) {
    a[1 + kSlots * rank] = static_cast<double>(mine.step);
    a[2 + kSlots * rank] = static_cast<double>(mine.epoch);
    a[3 + kSlots * rank] = static_cast<double>(mine.batch);
    a[4 + kSlots * rank] = mine.loss;
  }
  auto on_device = t.to(pg.device());
  pg.allreduce(on_device).wait();
  t = on_device.cpu();
  a = t.accessor<double, 1>();
  RankCheck check;
  check.preempt = a[0] > 0;
  check.nonfinite.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    auto& n = check.nonfinite[static_cast<size_t>(r)];
    n.step = static_cast<int64_t>(a[1 + kSlots * r]);
    n.epoch = static_cast<int64_t>(a[2 + kSlots * r]);
    n.batch = static_cast<int64_t>(a[3 + kSlots * r]);
    n.loss = a[4 + kSlots * r];
  }
  return check;
}

namespace {

std::string describe(const NonFiniteStep& n, int rank) {
  std::ostringstream s;
  s << (std::isnan(n.loss) ? "nan" : n.loss > 0 ? "inf" : "-inf") << " on rank " << rank << " at step " << n.step
    << " (epoch " << n.epoch + 1 << ", batch " << n.batch << ")";
  return s.str();
}

}  // namespace

void on_nonfinite_loss(const RankCheck& check, NonFiniteStep& mine, bool& warned, const TrainOptions& opts,
                       const TrainState& state, ProcessGroup& pg) {
  int first = -1;
  std::vector<std::string> others;
  for (int r = 0; r < static_cast<int>(check.nonfinite.size()); ++r) {
    const auto& n = check.nonfinite[static_cast<size_t>(r)];
    if (n.step == 0) continue;
    if (first < 0 || n.step < check.nonfinite[static_cast<size_t>(first)].step) first = r;
  }
  for (int r = 0; r < static_cast<int>(check.nonfinite.size()); ++r)
    if (r != first && check.nonfinite[static_cast<size_t>(r)].step > 0)
      others.push_back(describe(check.nonfinite[static_cast<size_t>(r)], r));
  std::string what = "the training loss is " + describe(check.nonfinite[static_cast<size_t>(first)], first);
  for (size_t i = 0; i < others.size(); ++i) what += (i ? ", " : "; then ") + others[i];
  mine = NonFiniteStep{};
  if (opts.nonfinite_loss() == "continue") {
    if (!warned && pg.rank() == 0)
      std::cout << "warning: " << what << "; training on (--nonfinite-loss continue)" << std::endl;
    warned = true;
    return;
  }
  const std::string last = state.last_checkpoint.empty()
                               ? "no checkpoint was written before it"
                               : "the last good checkpoint is " + state.last_checkpoint + " (after epoch " +
                                     std::to_string(state.last_checkpoint_epoch) + ")";
  throw NonFiniteLoss(rank_tag(pg) + ": " + what + ". Training stopped before a checkpoint of the diverged model; " +
                      last + ". Lower --lr or check the input data" +
                      (state.last_checkpoint.empty() ? std::string() : " and resume (--resume " + state.last_checkpoint + ")") +
                      ", or pass --nonfinite-loss continue to train on regardless");
}

void resume_inside_epoch(DistributedSampler& sampler, int64_t epoch, int64_t batch_size, const TrainState& state,
                         ProcessGroup& pg) {
  const size_t n = sampler.dataset_size(), taken = static_cast<size_t>(state.epoch_samples);
  if (taken > n)
    throw CheckpointError(rank_tag(pg) + ": the checkpoint says " + std::to_string(taken) + " samples of epoch " +
                          std::to_string(epoch + 1) + " were taken, but the data set has " + std::to_string(n) +
                          "; was it written for another data set?");
  sampler.set_start(taken);
  if (pg.rank() != 0) return;
  std::ostringstream line;
  line << "resumed after " << taken << " of " << n << " samples of epoch " << epoch + 1 << " (" << state.epoch_step
       << " batches per rank before): the other " << n - taken << " go to " << pg.size() << " ranks, "
       << sampler.num_samples() << " each (" << sampler.total_size() - std::min(sampler.total_size(), n - taken)
       << " repeated to pad), in batches of " << batch_size;
  if (state.run)
    state.run->log(line.str());
  else
    std::cout << line.str() << std::endl;
}

namespace {

int64_t launcher_round() {
  for (const char* name : {"DDPRUN_RDZV_ROUND", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"})
    if (const char* v = std::getenv(name))
      if (auto n = parse_integer(v, 0, INT32_MAX)) return *n;
  return 0;
}

}  // namespace

SampleLog::SampleLog(const TrainOptions& opts, const DistributedSampler& sampler, int64_t epoch,
                     const TrainState& state, ProcessGroup& pg)
    : round_(launcher_round()), epoch_(epoch), mine_(sampler.indices()) {
  const auto dir = std::filesystem::path(opts.run_dir()) / "samples";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // A recoverable group's ranks change as it re-forms: the launch rank names the file.
  const auto* recoverable = dynamic_cast<const RecoverableGroup*>(&pg);
  const int rank = recoverable ? recoverable->slot() : pg.rank();
  const std::string path = (dir / ("rank" + std::to_string(rank) + ".txt")).string();
  fd_.reset(open_append_no_follow(path));  // CheckpointError naming it if it cannot
  path_ = path;
  static bool headed = false;  // once per process: where this run of the program began
  if (!headed) {
    headed = true;
    append_line("# resumed " + std::to_string(round_) + " " + std::to_string(state.step));
  }
}

void SampleLog::append_line(std::string line) {
  line += '\n';
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_.get(), line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CheckpointError("cannot append to " + path_ + " (--log-samples): " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::string SampleLog::indices(int64_t batch, int64_t batch_size) const {
  std::string out;
  const size_t lo = static_cast<size_t>(batch * batch_size);
  const size_t hi = std::min(mine_.size(), lo + static_cast<size_t>(batch_size));
  for (size_t i = lo; i < hi; ++i) out += " " + std::to_string(mine_[i]);
  return out;
}

void SampleLog::step(int64_t batch, int64_t batch_size, int64_t step) {
  append_line(std::to_string(round_) + " " + std::to_string(epoch_) + " " + std::to_string(step) +
              indices(batch, batch_size));
}

void SampleLog::failed(int64_t batch, int64_t batch_size, int64_t step) {
  append_line("# failed " + std::to_string(round_) + " " + std::to_string(epoch_) + " " + std::to_string(step) +
              indices(batch, batch_size));
}

}  // namespace detail

void end_epoch(int64_t epoch, const TrainEpoch& train, double test_loss, double test_metric, const std::string& line,
               const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, const TrainOptions& opts,
               TrainState& state, RunDir& run, ProcessGroup& pg) {
  if (dynamic_cast<RecoverableGroup*>(&pg)) detail::track_live_state(state);
  run.follow(pg, state.step);  // a recoverable group's rank 0 may have changed in the evaluation
  state.epoch = epoch + 1;
  state.sampler_epoch = epoch + 1;
  const EpochMetrics m{state.epoch, train.loss, test_loss, test_metric, train.samples_per_s(), train.seconds};
  run.record(m);
  const auto& groups = optimizer.param_groups();
  detail::write_epoch_records(run, m, state.step, groups.empty() ? 0.0 : groups[0].options().get_lr(), state.scaler);
  run.log("epoch " + std::to_string(state.epoch) + ": " + line);
  detail::forget_epoch_trained();  // the state says where the next epoch starts
  if (!opts.checkpoint_due(state.epoch)) return;
  const std::string path = detail::kit_checkpoint_path(run, state);
  if (state.writer) {
    state.writer->save(path, model, optimizer, state);
    if (state.epoch >= opts.epochs()) state.writer->wait();  // the run's last save is on disk before it ends
  } else {
    // A rank lost while it is written: the ranks left write it again.
    detail::until_agreed(pg, "the checkpoint", [&] {
      run.follow(pg, state.step);
      save_checkpoint(path, model, optimizer, state, pg);
      return true;
    });
  }
  state.last_checkpoint = path;
  state.last_checkpoint_epoch = state.epoch;
}

std::string classifier_epoch_line(const TrainEpoch& train, const ClassifierResult& eval) {
  char line[160];
  std::snprintf(line, sizeof line, "train loss %.4f, test loss %.4f, test acc %.4f (%lld samples), %.1f s", train.loss,
                eval.loss(), eval.accuracy(), static_cast<long long>(eval.count), train.seconds);
  return line;
}

void save_ddp_logging_data(RunDir& run, const DistributedDataParallelBase& model, ProcessGroup& pg) {
  const auto parts = detail::all_gather_bytes(pg, model.get_ddp_logging_data().to_json());
  if (pg.rank() != 0) return;
  std::string text = "[\n";
  for (size_t r = 0; r < parts.size(); ++r) text += (r ? ",\n" : "") + parts[r];
  text += "]\n";
  const std::string path = run.file("ddp_logging.json");
  write_atomically(path, std::vector<char>(text.begin(), text.end()));
  run.log("DDP logging data: " + path);
}

void finish_run(RunDir& run, const torch::nn::Module& model, const ProcessGroup& pg, const std::string& summary) {
  detail::forget_live_state();
  if (pg.rank() == 0) save_state_dict(model, run.model_path());
  if (!summary.empty()) run.log(summary);
  run.draw_charts();
  run.close_tensorboard();
}

}  // namespace ddp
