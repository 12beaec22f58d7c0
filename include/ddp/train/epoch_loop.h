// The epoch loop every example shares, so that an example's main shows only
// what is its own (the model, the data, the step, the evaluation):
//
//   for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
//     auto train = ddp::train_epoch(*loader, sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
//       optimizer.zero_grad();
//       auto loss = torch::nn::functional::cross_entropy(model(b.data), b.target);
//       loss.backward();
//       optimizer.step();
//       return loss;
//     });
//     auto eval = ddp::evaluate_classifier(net, *test_loader, *pg, opts.limit_batches());
//     ddp::end_epoch(epoch, train, eval.loss(), eval.accuracy(), "test acc ...", *net, optimizer, opts, state, run, *pg);
//   }
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/parallel/distributed_sampler.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/prefetch.h"
#include "ddp/train/preemption.h"
#include "ddp/train/progress.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/state_dict.h"
#include "ddp/train/train_options.h"

namespace ddp {

// What one training epoch measured, over every rank.
struct TrainEpoch {
  double loss = 0;      // mean training loss per sample
  int64_t samples = 0;  // all ranks together
  double seconds = 0;
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0.0; }
};

namespace detail {

// A rank's first step whose loss was not finite (step 0: none yet).
struct NonFiniteStep {
  int64_t step = 0;   // optimizer steps taken, counting this one
  int64_t epoch = 0;  // 0-based
  int64_t batch = 0;  // 1-based, within the epoch
  double loss = 0;
};

// What the ranks told each other at a check.
struct RankCheck {
  bool preempt = false;                 // some rank got the preemption warning
  std::vector<NonFiniteStep> nonfinite;  // by rank
  bool any_nonfinite() const;
};

// Collective, one all-reduce: the preemption flags and every rank's first
// non-finite step.
RankCheck check_ranks(ProcessGroup& pg, bool preempt, const NonFiniteStep& mine);

// The ranks found a non-finite loss: throws NonFiniteLoss naming the first
// rank and step and the last good checkpoint, or with --nonfinite-loss
// continue warns (on rank 0, once per epoch) and forgets `mine`.
void on_nonfinite_loss(const RankCheck& check, NonFiniteStep& mine, bool& warned, const TrainOptions& opts,
                       const TrainState& state, ProcessGroup& pg);

// One rank's training losses of an epoch, kept where the losses are: a
// GPU's are never read back at a step (that would make the host wait for
// the GPU, and the next batch with it). read() brings back their sum over
// samples and the first step whose loss was not finite, at the points the
// loop synchronises anyway (the ranks' checks, the epoch's end).
class LossTally {
 public:
  // The next step's loss (the first added is step index 0), over `samples` samples.
  void add(const at::Tensor& loss, int64_t samples);
  struct Read {
    double sum = 0;             // loss x samples, summed in float64
    int64_t nonfinite = -1;     // the first step index whose loss was not finite, or -1
    double nonfinite_loss = 0;
  };
  Read read() const;
  // Forgets the non-finite step (--nonfinite-loss continue, after the warning).
  void forget_nonfinite();

 private:
  at::Tensor sum_;    // float64, on the losses' device
  at::Tensor steps_;  // float64: the steps added
  at::Tensor bad_;    // float64 [index + 1, loss] of the first non-finite loss ([0, 0]: none)
};

// A resumed epoch: the sampler starts at state.epoch_samples (checked
// against the data set: ddp::CheckpointError if beyond it), logged on rank 0
// to state.run (or stdout) as "resumed after N of M samples of epoch E".
void resume_inside_epoch(DistributedSampler& sampler, int64_t epoch, int64_t batch_size, const TrainState& state,
                         ProcessGroup& pg);

// --log-samples: this rank's record of the samples each step trained on, in
// <run-dir>/samples/rank<R>.txt (appended; a link there is refused). The
// first epoch a process trains writes "# resumed ROUND STEP": the launcher's
// round (DDPRUN_RDZV_ROUND, else TORCHELASTIC_RESTART_COUNT, else
// SLURM_RESTART_COUNT, else 0) and the optimizer steps already taken. Then
// one line per step: "ROUND EPOCH STEP INDEX...", EPOCH 0-based, STEP the
// global optimizer step it was. A step of round r whose STEP is above the
// STEP a later round resumed after was undone by that resume (the model
// went back to the checkpoint): what an audit leaves out.
class SampleLog {
 public:
  SampleLog(const TrainOptions& opts, const DistributedSampler& sampler, int64_t epoch, const TrainState& state,
            ProcessGroup& pg);
  ~SampleLog();
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;
  // The step just taken: this rank's batch `batch` (0-based in this run of
  // the epoch) of `batch_size`, global step `step`.
  void step(int64_t batch, int64_t batch_size, int64_t step);

 private:
  void append_line(std::string line);
  int fd_ = -1;
  std::string path_;
  int64_t round_ = 0, epoch_ = 0;
  std::vector<size_t> mine_;  // this rank's indices for the epoch, from its start
};

}  // namespace detail

// One training epoch: the sampler's epoch set, its batches gathered ahead on
// a thread of their own and, on a GPU, already there (ddp::Prefetcher), at most
// opts.steps_per_epoch(...) batches, a progress bar on rank 0, state.step
// counted, the loss summed over ranks in one all-reduce (collective).
// step(batch) does one optimizer step and returns the batch's mean loss, a
// tensor the loop reads back only where it synchronises anyway (the bar's
// redraw, the ranks' checks, the epoch's end): no step makes the host wait
// for the GPU. The batch's size is batch.data.size(0).
// After a checkpoint written inside this epoch (state.epoch_samples > 0,
// possibly at another world size), the sampler starts at that global
// position (DistributedSampler::set_start): the epoch sees each sample once,
// the samples left shared out over the ranks there are now, and its loss
// covers the batches after the resume. --limit-batches counts the batches
// taken before too (state.epoch_step). Each step advances
// state.epoch_samples by the samples all ranks took; the epoch's end sets
// both counts and the sampler's start back to 0.
// Every opts.preemption_check_every() steps the ranks compare notes in one
// all-reduce: when any rank's loss was NaN or infinite, every rank throws
// ddp::NonFiniteLoss (or warns, with --nonfinite-loss continue); when
// state.checkpoint_and_stop is set and any rank got a preemption warning or
// a stop request, every rank calls it at the same step, a step boundary (it
// throws ddp::Preempted). The epoch's end checks the losses too, so no
// checkpoint of a diverged model is written.
template <typename Loader, typename Step>
TrainEpoch train_epoch(Loader& loader, DistributedSampler& sampler, int64_t epoch, int64_t batch_size,
                       const TrainOptions& opts, TrainState& state, ProcessGroup& pg, Step&& step) {
  sampler.set_epoch(epoch);
  if (state.epoch_samples > 0) detail::resume_inside_epoch(sampler, epoch, batch_size, state, pg);
  const int64_t samples = static_cast<int64_t>(sampler.num_samples());
  const int64_t steps = opts.steps_per_epoch(sampler.num_samples(), batch_size, state.epoch_step);
  const int64_t check_every = opts.preemption_check_every();
  Progress bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(opts.epochs()), steps, pg.rank() == 0);
  detail::LossTally losses;
  detail::NonFiniteStep nonfinite;
  bool warned = false;
  int64_t taken = 0, taken_samples = 0;  // steps and samples of this rank in this run of the epoch
  const int64_t first_step = state.step, first_epoch_step = state.epoch_step;
  // The first non-finite loss the tally holds, as a step of the run (read
  // back only where the ranks compare notes: a synchronisation anyway).
  auto note_nonfinite = [&] {
    const auto read = losses.read();
    if (read.nonfinite >= 0 && nonfinite.step == 0)
      nonfinite = {first_step + read.nonfinite + 1, epoch, first_epoch_step + read.nonfinite + 1, read.nonfinite_loss};
    return read;
  };
  auto check = [&](bool preempt) {
    note_nonfinite();
    const auto result = detail::check_ranks(pg, preempt, nonfinite);
    if (result.any_nonfinite()) {
      detail::on_nonfinite_loss(result, nonfinite, warned, opts, state, pg);
      if (nonfinite.step == 0) losses.forget_nonfinite();
    }
    return result;
  };
  std::optional<detail::SampleLog> sample_log;
  if (opts.log_samples()) sample_log.emplace(opts, sampler, epoch, state, pg);
  {
    Prefetcher<Loader> batches(loader, pg.device(), std::chrono::seconds(opts.timeout_s()));
    while (taken < steps) {
      auto batch = batches.next();
      if (!batch) break;
      if (check_every > 0 && taken % check_every == 0) {
        const bool preempt = state.checkpoint_and_stop && preemption_signal_received() != 0;
        if (check(preempt).preempt && state.checkpoint_and_stop) {
          TrainState here = state;  // epoch_step and epoch_samples: the steps taken, every one whole
          here.epoch = epoch;
          here.sampler_epoch = epoch;
          state.checkpoint_and_stop(here);
        }
      }
      const int64_t n = batch->data.size(0);
      const at::Tensor loss = step(*batch).detach();
      losses.add(loss, n);
      // This rank's share of the step; every rank takes as many but the last.
      state.epoch_samples += std::min(batch_size, samples - taken * batch_size) * pg.size();
      ++taken;
      taken_samples += n;
      ++state.epoch_step;
      ++state.step;
      if (sample_log) sample_log->step(taken - 1, batch_size, state.step);
      // The loss is read back only when the bar shows it.
      bar.update(bar.shows_next() ? std::optional<double>(loss.template item<double>()) : std::nullopt, n * pg.size());
    }
  }
  state.epoch_step = 0;
  state.epoch_samples = 0;
  sampler.set_start(0);
  bar.finish();
  MetricSums sums({"loss"});
  sums.add("loss", note_nonfinite().sum);
  sums.add_count(taken_samples);
  const auto total = sums.all_reduced(pg);
  // The same sum on every rank, so all of them take this branch or none.
  if (!std::isfinite(total.sum("loss"))) check(false);
  return {total.mean("loss"), total.count(), bar.elapsed_seconds()};
}

// The end of an epoch (collective): the state advanced past `epoch`, its row
// in metrics.csv, `line` logged after "epoch N: ", and a checkpoint when
// opts.checkpoint_due().
void end_epoch(int64_t epoch, const TrainEpoch& train, double test_loss, double test_metric, const std::string& line,
               const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, const TrainOptions& opts,
               TrainState& state, RunDir& run, ProcessGroup& pg);

// "train loss 0.5123, test loss 0.4821, test acc 0.8312 (10000 samples), 12.3 s":
// a classifier's epoch, as the examples log it.
std::string classifier_epoch_line(const TrainEpoch& train, const ClassifierResult& eval);

// The end of a run: the model's state dict as <run-dir>/model.pt (rank 0),
// `summary` logged unless empty, the charts drawn.
void finish_run(RunDir& run, const torch::nn::Module& model, const ProcessGroup& pg, const std::string& summary = "");

// optimizer.step(), shown on the model's DDP timeline as "optimizer step"
// when one runs (--timeline, DDP_TIMELINE).
template <typename Optimizer>
void optimizer_step(const DistributedDataParallelBase& model, Optimizer& optimizer) {
  const auto& timeline = model.timeline();
  const int64_t start = timeline ? timeline->now_us() : 0;
  optimizer.step();
  if (timeline) timeline->span(Timeline::Row::compute, "optimizer step", start, timeline->now_us());
}

// scaler.step(optimizer) and scaler.update() (ddp/grad_scaler.h; collective
// while the scaler is enabled), shown on the timeline as "optimizer step".
// Returns whether the optimizer stepped: false when a rank found inf/NaN
// gradients, on every rank alike.
inline bool optimizer_step(const DistributedDataParallelBase& model, torch::optim::Optimizer& optimizer,
                           GradScaler& scaler) {
  const auto& timeline = model.timeline();
  const int64_t start = timeline ? timeline->now_us() : 0;
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  if (timeline) timeline->span(Timeline::Row::compute, stepped ? "optimizer step" : "optimizer step skipped (inf/NaN)",
                               start, timeline->now_us());
  return stepped;
}

// Collective: every rank's DDP logging data (ddp/logging_data.h: the buckets,
// unused parameters, rebuilds, mean forward, backward, communication and
// exposed-communication times), written by rank 0 as
// <run-dir>/ddp_logging.json, a JSON array in rank order.
void save_ddp_logging_data(RunDir& run, const DistributedDataParallelBase& model, ProcessGroup& pg);

}  // namespace ddp
