// One run of an epoch's loop, all of it but the loader and the step
// (epoch_loop.h's detail::EpochRun): the counts a step advances, the loss
// tally, the ranks' checks every preemption_check_every() steps and at the
// epoch's end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include "ddp/comm/recovery.h"
#include "ddp/train/epoch_loop.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/preemption.h"
#include "ddp/train/progress.h"
#include "ddp/train/run_dir.h"
#include "train/epoch_checks.h"
#include "train/kit_checkpoint.h"
#include "train/live_state.h"
#include "train/recovery_glue.h"
#include "train/run_tensorboard.h"

namespace ddp::detail {

struct EpochRun::State {
  State(DistributedSampler& sampler, int64_t epoch, int64_t batch_size, const TrainOptions& opts, TrainState& state,
        ProcessGroup& pg)
      : sampler(sampler),
        epoch(epoch),
        batch_size(batch_size),
        opts(opts),
        state(state),
        pg(pg),
        recoverable(dynamic_cast<RecoverableGroup*>(&pg)),
        samples(static_cast<int64_t>(sampler.num_samples())),
        steps(opts.steps_per_epoch(sampler.num_samples(), batch_size, state.epoch_step)),
        bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(opts.epochs()), steps, pg.rank() == 0),
        first_step(state.step),
        first_epoch_step(state.epoch_step) {}

  // The first non-finite loss the tally holds, as a step of the run (read
  // back only where the ranks compare notes: a synchronisation anyway).
  LossTally::Read note_nonfinite() {
    const auto read = losses.read();
    if (read.nonfinite >= 0 && nonfinite.step == 0)
      nonfinite = {first_step + read.nonfinite + 1, epoch, first_epoch_step + read.nonfinite + 1, read.nonfinite_loss};
    return read;
  }

  // Collective: the ranks' preemption flags and non-finite losses.
  RankCheck check(bool preempt) {
    note_nonfinite();
    const auto result = check_ranks(pg, preempt, nonfinite);
    if (result.any_nonfinite()) {
      on_nonfinite_loss(result, nonfinite, warned, opts, state, pg);
      if (nonfinite.step == 0) losses.forget_nonfinite();
    }
    return result;
  }

  DistributedSampler& sampler;
  const int64_t epoch, batch_size;
  const TrainOptions& opts;
  TrainState& state;
  ProcessGroup& pg;
  RecoverableGroup* const recoverable;  // null on any other group
  int generation = recoverable ? recoverable->generation() : 0;  // the sampler's shards'
  // The ranks the sampler's shards are for: who trains each step, even one
  // whose update re-formed the group (a ZeroRedundancyOptimizer's broadcast).
  int world = pg.size();
  int64_t samples, steps;  // this rank's, from where the epoch (re)started
  int64_t votes_before = 0;
  Progress bar;
  LossTally losses;
  NonFiniteStep nonfinite;
  bool warned = false;
  int64_t taken = 0, taken_samples = 0;  // steps and samples of this rank in this run of the epoch
  const int64_t first_step, first_epoch_step;
  std::optional<SampleLog> sample_log;
  // Since the last TensorBoard step record: when, and how many steps.
  std::chrono::steady_clock::time_point window_start = std::chrono::steady_clock::now();
  int64_t window_steps = 0;
};

namespace {

// Steps voted on by commit_or_throw (ddp::optimizer_step) in this process.
int64_t g_votes = 0;

// Thrown between steps once a recoverable group took joining ranks in, or
// re-formed inside a committed step (a ZeroRedundancyOptimizer's broadcast):
// the epoch's data goes on at the new size (EpochRun::recover).
struct GroupChanged : std::exception {
  explicit GroupChanged(const char* how) : how(how) {}
  const char* what() const noexcept override { return how; }
  const char* how;
};

// The sampler's epoch, and where it starts after a checkpoint written
// inside the epoch. Before the state's counts are read.
DistributedSampler& start_epoch(DistributedSampler& sampler, int64_t epoch, int64_t batch_size,
                                const TrainState& state, ProcessGroup& pg) {
  // A recoverable group's ranks change as it re-forms (a rank that joined
  // made its sampler with its launch rank).
  if (dynamic_cast<RecoverableGroup*>(&pg)) sampler.set_replicas(pg.size(), pg.rank());
  sampler.set_epoch(epoch);
  if (state.epoch_samples > 0) resume_inside_epoch(sampler, epoch, batch_size, state, pg);
  return sampler;
}

}  // namespace

EpochRun::EpochRun(DistributedSampler& sampler, int64_t epoch, int64_t batch_size, const TrainOptions& opts,
                   TrainState& state, ProcessGroup& pg)
    : s_(std::make_unique<State>(start_epoch(sampler, epoch, batch_size, state, pg), epoch, batch_size, opts, state,
                                 pg)) {
  if (s_->recoverable) track_live_state(state);
  forget_epoch_trained();
  if (opts.log_samples()) s_->sample_log.emplace(opts, sampler, epoch, state, pg);
}

EpochRun::~EpochRun() = default;

bool EpochRun::wants_more() const { return s_->taken < s_->steps; }

void EpochRun::before_step() {
  State& s = *s_;
  if (s.recoverable && s.recoverable->grow_pending()) {
    s.recoverable->set_state([&s] { return live_state_bytes(s.state, s.pg); }, {});
    s.recoverable->grow();
    throw GroupChanged("ranks joined");
  }
  if (s.recoverable && s.recoverable->generation() != s.generation) throw GroupChanged("a rank was lost");
  s.votes_before = g_votes;
  const int64_t check_every = s.opts.preemption_check_every(), save_every = s.opts.checkpoint_every_steps();
  // --checkpoint-every-steps: after the ranks' check, so that no checkpoint holds a diverged model.
  const bool save = save_every > 0 && s.taken > 0 && s.state.step % save_every == 0 && s.state.writer &&
                    s.state.run && s.state.model && s.state.optimizer;
  if (!save && (check_every <= 0 || s.taken % check_every != 0)) return;
  const bool preempt = s.state.checkpoint_and_stop && preemption_signal_received() != 0;
  const bool stop = s.check(preempt).preempt && s.state.checkpoint_and_stop;
  if (!stop && !save) return;
  TrainState here = s.state;  // epoch_step and epoch_samples: the steps taken, every one whole
  here.epoch = s.epoch;
  here.sampler_epoch = s.epoch;
  if (stop) s.state.checkpoint_and_stop(here);
  const std::string path = kit_checkpoint_path(*s.state.run, s.state);
  s.state.writer->save(path, *s.state.model, *s.state.optimizer, here);
  s.state.last_checkpoint = path;
  s.state.last_checkpoint_epoch = s.epoch;
}

void EpochRun::after_step(const at::Tensor& loss, int64_t samples) {
  State& s = *s_;
  if (s.recoverable && g_votes == s.votes_before)
    throw UsageError("rank " + std::to_string(s.pg.rank()) + ": the step did not call ddp::optimizer_step: under "
                     "ddprun --recover-in-process a step's update must wait for every rank's vote, which "
                     "ddp::optimizer_step(model, optimizer) takes before it steps");
  s.losses.add(loss, samples);
  // This rank's share of the step; every rank takes as many but the last.
  s.state.epoch_samples += std::min(s.batch_size, s.samples - s.taken * s.batch_size) * s.world;
  ++s.taken;
  s.taken_samples += samples;
  ++s.state.epoch_step;
  ++s.state.step;
  if (s.sample_log) s.sample_log->step(s.taken - 1, s.batch_size, s.state.step);
  // The loss is read back only when the bar shows it; TensorBoard gets it then.
  ++s.window_steps;
  std::optional<double> shown;
  if (s.bar.shows_next()) {
    shown = loss.item<double>();
    if (s.state.run) {
      const auto now = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(now - s.window_start).count();
      detail::write_step_records(*s.state.run, s.state.step, *shown, ms / static_cast<double>(s.window_steps));
      s.window_start = now;
      s.window_steps = 0;
    }
  }
  s.bar.update(shown, samples * s.world);
}

bool EpochRun::recover() {
  State& s = *s_;
  if (!s.recoverable) return false;
  try {
    throw;
  } catch (const GroupChanged& changed) {
    return reshard(changed.how);
  } catch (const std::exception&) {
    if (!peer_fault(s.pg, "step " + std::to_string(s.state.step + 1))) return false;
  }
  if (s.sample_log) s.sample_log->failed(s.taken, s.batch_size, s.state.step + 1);
  reform_or_stop(*s.recoverable);
  return reshard("a rank was lost");
}

// The group's new size and this rank's place in it: the epoch's samples not
// yet taken, shared out again.
bool EpochRun::reshard(const std::string& how) {
  State& s = *s_;
  s.generation = s.recoverable->generation();
  s.world = s.pg.size();
  s.sampler.set_replicas(s.pg.size(), s.pg.rank());
  s.sampler.set_epoch(s.epoch);
  s.sampler.set_start(static_cast<size_t>(s.state.epoch_samples));
  s.samples = static_cast<int64_t>(s.sampler.num_samples());
  s.steps = s.opts.steps_per_epoch(s.sampler.num_samples(), s.batch_size, s.state.epoch_step);
  s.taken = 0;
  if (s.sample_log) {
    s.sample_log.reset();
    s.sample_log.emplace(s.opts, s.sampler, s.epoch, s.state, s.pg);
  }
  const std::string line = "epoch " + std::to_string(s.epoch + 1) + ": " + std::to_string(s.pg.size()) +
                           " ranks go on from sample " + std::to_string(s.state.epoch_samples) + " of " +
                           std::to_string(s.sampler.dataset_size()) + " (generation " +
                           std::to_string(s.recoverable->generation()) + ": " + how + ")";
  if (s.state.run) {
    s.state.run->follow(s.pg, s.state.step);  // the new rank 0 writes the run folder, if it changed
    s.state.run->log(line);
  } else if (s.pg.rank() == 0) {
    std::cout << line << std::endl;
  }
  return true;
}

TrainEpoch EpochRun::finish() {
  State& s = *s_;
  if (s.recoverable)  // padding may count positions past the end
    note_epoch_trained(s.epoch, s.state.epoch_step,
                       std::min<int64_t>(s.state.epoch_samples, static_cast<int64_t>(s.sampler.dataset_size())));
  s.state.epoch_step = 0;
  s.state.epoch_samples = 0;
  s.sampler.set_start(0);
  s.bar.finish();
  MetricSums sums({"loss"});
  sums.add("loss", s.note_nonfinite().sum);
  sums.add_count(s.taken_samples);
  // A rank lost here: the loss of the ranks left.
  const auto total = until_agreed(s.pg, "the epoch's loss", [&] { return sums.all_reduced(s.pg); });
  // The same sum on every rank, so all of them take this branch or none.
  if (!std::isfinite(total.sum("loss"))) s.check(false);
  return {total.mean("loss"), total.count(), s.bar.elapsed_seconds()};
}

void commit_or_throw(ProcessGroup& pg) {
  auto* group = dynamic_cast<RecoverableGroup*>(&pg);
  if (!group) return;
  ++g_votes;
  if (!group->should_commit())
    throw CommError("rank " + std::to_string(pg.rank()) + ": the step did not commit: a rank failed, ended or "
                    "stayed silent during it");
}

void commit_or_throw(ProcessGroup& pg, GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  if (!dynamic_cast<RecoverableGroup*>(&pg) || !scaler.is_enabled()) return commit_or_throw(pg);
  try {
    unscale_before_vote(scaler, optimizer);
    commit_or_throw(pg);
  } catch (...) {
    forget_unscale(scaler, optimizer);
    throw;
  }
}

}  // namespace ddp::detail
