// The epoch loop's parts that need no loader (epoch_loop.h's train_epoch
// drives them through detail::EpochRun): the loss tally kept on the losses'
// device, the ranks' checks for non-finite losses and preemption, a resumed
// epoch's start, and --log-samples' record. Private to src/train/.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/distributed_sampler.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/train_options.h"
#include "runtime/unique_fd.h"

namespace ddp {

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
// the GPU, and the next batch with it), and a step costs one copy on the
// device. read() brings the steps' losses back in one copy, at the points
// the loop synchronises anyway (the ranks' checks, the epoch's end), and
// keeps their sum over samples and the first step whose loss was not finite.
class LossTally {
 public:
  // The next step's loss (the first added is step index 0), over `samples` samples.
  void add(const at::Tensor& loss, int64_t samples);
  struct Read {
    double sum = 0;             // loss x samples, summed in float64
    int64_t nonfinite = -1;     // the first step index whose loss was not finite, or -1
    double nonfinite_loss = 0;
  };
  Read read();
  // Forgets the non-finite step (--nonfinite-loss continue, after the warning).
  void forget_nonfinite();

 private:
  static constexpr int64_t kPending = 64;  // steps kept on the device before a read back
  at::Tensor pending_;                     // float64 [kPending], on the losses' device
  std::vector<int64_t> pending_samples_;   // the samples of each pending step
  Read read_;                              // what the steps read back so far give
  int64_t steps_read_ = 0;
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
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;
  // The step just taken: this rank's batch `batch` (0-based in this run of
  // the epoch) of `batch_size`, global step `step`.
  void step(int64_t batch, int64_t batch_size, int64_t step);
  // The same for a step that failed and is trained again (a group that
  // re-formed): "# failed ROUND EPOCH STEP INDEX...".
  void failed(int64_t batch, int64_t batch_size, int64_t step);

 private:
  void append_line(std::string line);
  std::string indices(int64_t batch, int64_t batch_size) const;
  UniqueFd fd_;
  std::string path_;
  int64_t round_ = 0, epoch_ = 0;
  std::vector<size_t> mine_;  // this rank's indices for the epoch, from its start
};

}  // namespace detail

}  // namespace ddp
