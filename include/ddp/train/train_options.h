// The command line every example shares (Boost.ProgramOptions), with each
// example's own defaults and, optionally, its own extra options:
//
//   auto opts = ddp::parse_train_options(argc, argv,
//       ddp::TrainOptions().epochs(10).global_batch_size(256).lr(0.2).run_dir("runs/lenet_fmnist"));
//   int64_t batch = opts.per_process_batch(pg->size());
//
// --help prints the options and exits 0; a bad option throws ddp::UsageError.
#pragma once

#include <boost/program_options.hpp>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "ddp/parallel/ddp_options.h"
#include "ddp/errors.h"
#include "ddp/comm/process_group.h"

namespace ddp {

struct TrainOptions {
  TORCH_ARG(int64_t, epochs) = 10;
  // Per process. 0: global_batch_size / world size.
  TORCH_ARG(int64_t, batch_size) = 0;
  // All processes together; must divide by the world size (but see
  // per_process_batch for a restart at another world size).
  TORCH_ARG(int64_t, global_batch_size) = 0;
  TORCH_ARG(double, lr) = 0.1;
  TORCH_ARG(uint64_t, seed) = 0;
  // The defaults of the options these become, written once there.
  TORCH_ARG(std::string, backend) = ProcessGroupOptions().backend();
  TORCH_ARG(double, bucket_cap_mb) = DistributedDataParallelOptions().bucket_cap_mb();
  // --bucket-cap-mb auto: DDP picks the bucket size (bucket_cap_mb("auto")).
  TORCH_ARG(bool, bucket_cap_auto) = false;
  // Seconds every collective and the rendezvous may wait.
  TORCH_ARG(int64_t, timeout_s) =
      std::chrono::duration_cast<std::chrono::seconds>(ProcessGroupOptions().timeout()).count();
  TORCH_ARG(std::string, data_dir) = "";
  TORCH_ARG(std::string, run_dir) = "runs/run";
  // Write <run-dir>/checkpoint.pt every N epochs (and after the last); 0: only after the last.
  TORCH_ARG(int64_t, checkpoint_every) = 1;
  // A checkpoint file or a run folder to continue from; "" for a fresh start;
  // "auto" (--resume alone): the run folder's checkpoint if it has one, else
  // a fresh start.
  TORCH_ARG(std::string, resume) = "";
  // DataLoader worker threads (0: load in the training thread).
  TORCH_ARG(int64_t, workers) = 0;
  // At most this many batches per epoch, in training and in evaluation; -1: all.
  TORCH_ARG(int64_t, limit_batches) = -1;
  // Every N training steps the ranks ask each other whether a preemption
  // warning (SIGUSR1) arrived (ddp/train/preemption.h); 0: SIGUSR1 is not
  // watched and keeps its default action.
  TORCH_ARG(int64_t, preemption_check_every) = 10;
  // Write the DDP timeline of the run (a Chrome trace, ddp/timeline.h) to
  // <run-dir>/timeline.json and its rank skew table beside it; the same as
  // DDP_TIMELINE=<file>, which wins when set.
  TORCH_ARG(bool, timeline) = false;
  // With the timeline, also print and keep the rank skew table every N
  // synchronised steps (DDP_TIMELINE_SKEW_EVERY); 0: at the end only. N > 0
  // turns the timeline on.
  TORCH_ARG(int64_t, timeline_skew_every) = 0;
  // What a loss that is not finite (NaN, inf) on any rank does: "stop"
  // (ddp::NonFiniteLoss on every rank, before the next checkpoint) or
  // "continue" (a warning on rank 0, and training goes on).
  TORCH_ARG(std::string, nonfinite_loss) = "stop";
  // Mixed precision (--amp): forward and loss under ddp::Autocast, bfloat16
  // on CPU, float16 on CUDA with a ddp::GradScaler (the examples' choice;
  // ddp/autocast.h, ddp/grad_scaler.h).
  TORCH_ARG(bool, amp) = false;
  // Record which samples every step trained on, in
  // <run-dir>/samples/rank<R>.txt (ddp/train/epoch_loop.h says the format):
  // an audit of the data order, across resumes and world-size changes.
  TORCH_ARG(bool, log_samples) = false;

 public:
  // The per-process batch: --batch-size if given (the global batch is then
  // that x world), else --global-batch-size / world, which must divide at a
  // fresh start (UsageError). A restarted process (ddp::restart_reason(): an
  // elastic job that lost or gained a node may come back at a world size
  // that does not divide it) takes floor(global / world), at least 1, and
  // rank 0 warns with the effective global batch. The learning rate is
  // never changed. The rank that warns is the launch environment's rank 0
  // (ddp/runtime/launch_env.h), or pg's.
  int64_t per_process_batch(int world_size) const;
  int64_t per_process_batch(const ProcessGroup& pg) const;
  // The checkpoint --resume names (a folder means its checkpoint.pt); "" when not resuming.
  std::string resume_path() const;
  ProcessGroupOptions process_group_options() const;
  DDPOptions ddp_options() const;
  // Batches per epoch for `samples` per rank: ceil(samples / batch), capped
  // so that `taken` (batches of the epoch taken before a resume) plus them
  // stay within --limit-batches.
  int64_t steps_per_epoch(size_t samples, int64_t batch, int64_t taken = 0) const;
  // Whether to write a checkpoint after `completed` epochs (--checkpoint-every, and always after the last).
  bool checkpoint_due(int64_t completed) const;
  // Every option as text, for checkpoints and logs.
  std::map<std::string, std::string> to_config() const;
};

// Parses argv over `defaults`. `extra` adds an example's own options (bound
// to its variables). --help prints usage on stdout and exits 0.
TrainOptions parse_train_options(int argc, char** argv, TrainOptions defaults = {},
                                 const boost::program_options::options_description* extra = nullptr);

}  // namespace ddp
