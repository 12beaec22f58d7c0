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
#include <memory>
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
#include "ddp/train/errors.h"

namespace ddp {

// What one training epoch measured, over every rank.
struct TrainEpoch {
  double loss = 0;      // mean training loss per sample
  int64_t samples = 0;  // all ranks together
  double seconds = 0;
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0.0; }
};

namespace detail {

// One run of an epoch's loop, all of it but the loader and the step
// (src/train/epoch_run.cpp): the sampler's epoch and resume, the progress
// bar, the counts in `state`, the loss tally, the ranks' checks, the
// epoch's end.
class EpochRun {
 public:
  EpochRun(DistributedSampler& sampler, int64_t epoch, int64_t batch_size, const TrainOptions& opts,
           TrainState& state, ProcessGroup& pg);
  ~EpochRun();
  EpochRun(const EpochRun&) = delete;
  EpochRun& operator=(const EpochRun&) = delete;
  // Whether the epoch takes another step.
  bool wants_more() const;
  // Before each step: the ranks compare notes when due (may throw
  // NonFiniteLoss, or Preempted through state.checkpoint_and_stop).
  void before_step();
  // The step just taken: its mean loss (not read back unless the bar shows
  // it) over `samples` samples.
  void after_step(const at::Tensor& loss, int64_t samples);
  // The epoch's end (collective): counts reset, the loss over every rank.
  TrainEpoch finish();
  // Inside a catch: on a recoverable group (ddp/comm/recovery.h) and an
  // error that is a peer's fault, not the program's: the group re-formed,
  // the sampler re-sharded from the samples the committed steps took, and
  // true (the loop goes on). False: the error is to be rethrown.
  bool recover();

 private:
  bool reshard(const std::string& how);
  struct State;
  std::unique_ptr<State> s_;
};

// The model's ReducerStats after a step, kept for the run's TensorBoard
// records (rank 0, with --tensorboard; nothing otherwise).
void note_ddp_step(const DistributedDataParallelBase& model);

// On a recoverable group: the step's vote (should_commit), and a CommError
// when it does not commit, so that no rank applies the update. Nothing on
// any other group.
void commit_or_throw(ProcessGroup& pg);
// The same with a loss scaler: its inf/NaN all-reduce first, forgotten when
// the step does not commit.
void commit_or_throw(ProcessGroup& pg, GradScaler& scaler, torch::optim::Optimizer& optimizer);

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
// On a recoverable group (opts.init_process_group() under ddprun
// --recover-in-process), a rank lost during a step costs the others that
// step: it commits on no rank (ddp::optimizer_step votes before it steps),
// the group re-forms, and the epoch goes on from the samples the committed
// steps took, shared out over the ranks left, each with the same per-process
// batch (the global batch shrinks with the world, as in Horovod's elastic
// mode); --log-samples shows the failed step's samples twice.
template <typename Loader, typename Step>
TrainEpoch train_epoch(Loader& loader, DistributedSampler& sampler, int64_t epoch, int64_t batch_size,
                       const TrainOptions& opts, TrainState& state, ProcessGroup& pg, Step&& step) {
  detail::EpochRun run(sampler, epoch, batch_size, opts, state, pg);
  for (bool going = true; going;) {
    try {
      Prefetcher<Loader> batches(loader, pg.device(), std::chrono::seconds(opts.timeout_s()));
      while (run.wants_more()) {
        auto batch = batches.next();
        if (!batch) break;
        run.before_step();
        const int64_t n = batch->data.size(0);
        run.after_step(step(*batch).detach(), n);
      }
      going = false;
    } catch (const std::exception&) {
      if (!run.recover()) throw;
    }
  }
  return run.finish();
}

// The end of an epoch (collective): the state advanced past `epoch`, its row
// in metrics.csv and its TensorBoard records (the learning rate of the first
// parameter group among them), `line` logged after "epoch N: ", and a checkpoint when
// opts.checkpoint_due().
void end_epoch(int64_t epoch, const TrainEpoch& train, double test_loss, double test_metric, const std::string& line,
               const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, const TrainOptions& opts,
               TrainState& state, RunDir& run, ProcessGroup& pg);

// "train loss 0.5123, test loss 0.4821, test acc 0.8312 (10000 samples), 12.3 s":
// a classifier's epoch, as the examples log it.
std::string classifier_epoch_line(const TrainEpoch& train, const ClassifierResult& eval);

// The end of a run: the model's state dict as <run-dir>/model.pt (rank 0),
// `summary` logged unless empty, the charts drawn, the options written as
// TensorBoard hyperparameters with the last epoch's figures.
void finish_run(RunDir& run, const torch::nn::Module& model, const ProcessGroup& pg, const std::string& summary = "");

// optimizer.step(), shown on the model's DDP timeline as "optimizer step"
// when one runs (--timeline, DDP_TIMELINE); the model's ReducerStats kept
// for the run's TensorBoard records. On a recoverable group, first the
// step's vote: a CommError, and no update, where it does not commit.
template <typename Optimizer>
void optimizer_step(const DistributedDataParallelBase& model, Optimizer& optimizer) {
  detail::commit_or_throw(model.process_group());
  const auto& timeline = model.timeline();
  const int64_t start = timeline ? timeline->now_us() : 0;
  optimizer.step();
  if (timeline) timeline->span(Timeline::Row::compute, "optimizer step", start, timeline->now_us());
  detail::note_ddp_step(model);
}

// scaler.step(optimizer) and scaler.update() (ddp/amp/grad_scaler.h; collective
// while the scaler is enabled), shown on the timeline as "optimizer step".
// Returns whether the optimizer stepped: false when a rank found inf/NaN
// gradients, on every rank alike.
inline bool optimizer_step(const DistributedDataParallelBase& model, torch::optim::Optimizer& optimizer,
                           GradScaler& scaler) {
  detail::commit_or_throw(model.process_group(), scaler, optimizer);
  const auto& timeline = model.timeline();
  const int64_t start = timeline ? timeline->now_us() : 0;
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  if (timeline) timeline->span(Timeline::Row::compute, stepped ? "optimizer step" : "optimizer step skipped (inf/NaN)",
                               start, timeline->now_us());
  detail::note_ddp_step(model);
  return stepped;
}

// Collective: every rank's DDP logging data (ddp/observe/logging_data.h: the buckets,
// unused parameters, rebuilds, mean forward, backward, communication and
// exposed-communication times), written by rank 0 as
// <run-dir>/ddp_logging.json, a JSON array in rank order.
void save_ddp_logging_data(RunDir& run, const DistributedDataParallelBase& model, ProcessGroup& pg);

}  // namespace ddp
