// Where a training run starts (ddp/train/checkpoint.h's resume_or_start):
// from a checkpoint (--resume, a restart), afresh, or, for a rank started in
// place of a lost one under in-process recovery, from the state the running
// group hands it.
#include "ddp/train/checkpoint.h"

#include <climits>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "comm/objects/object_exchange.h"
#include "ddp/comm/recovery.h"
#include "ddp/train/preemption.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/train_options.h"
#include "runtime/parse_number.h"
#include "train/kit_checkpoint.h"
#include "train/live_state.h"

namespace ddp {

// ---- resuming a run -------------------------------------------------------

std::string restart_reason() {
  // The most specific first: a failure restart sets both of ddprun's.
  for (const char* name : {"SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "DDPRUN_RDZV_ROUND"}) {
    const char* v = std::getenv(name);
    const auto count = v ? parse_integer(v, 0, INT32_MAX) : std::nullopt;
    if (count && *count > 0) return std::string(name) + "=" + v;
  }
  return "";
}

namespace {

// What rank 0 knows of the stop request: its own signal, or that another rank got one.
std::string signal_name(int signo) {
  if (signo == SIGUSR1) return "SIGUSR1 here and maybe elsewhere";
  if (signo == SIGTERM) return "SIGTERM here and maybe elsewhere: a stop request, as when a node joins or leaves";
  if (signo == 0) return "a signal on another rank";
  return "signal " + std::to_string(signo);
}

std::string position(const TrainState& s) {
  return "epoch " + std::to_string(s.epoch) +
         (s.epoch_samples > 0 ? " and " + std::to_string(s.epoch_samples) + " samples (" +
                                    std::to_string(s.epoch_step) + " batches per rank) of epoch " +
                                    std::to_string(s.epoch + 1)
                              : std::string());
}

// A rank started in place of a lost one (ddprun --recover-in-process): it
// waits until the running ranks take it in, and starts where they are.
TrainState join_running_group(RecoverableGroup& group, RunDir& run, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, GradScaler* scaler) {
  TrainState state;
  group.set_state({}, [&](const std::string& bytes) {
    state = detail::load_live_state(bytes, model, optimizer, group, scaler);
  });
  group.grow();
  run.follow(group, state.step);
  std::cout << "rank " << group.rank() << " (launch rank " << group.slot() << ") joined the running group at step "
            << state.step << ", after " << position(state) << std::endl;
  return state;
}

// Where a run that is not joining starts: its checkpoint (--resume, a
// restart), or afresh.
TrainState start_or_load(const TrainOptions& opts, RunDir& run, torch::nn::Module& model,
                         torch::optim::Optimizer& optimizer, ProcessGroup& pg, GradScaler* scaler) {
  TrainState state;
  // Rank 0's view of what --resume names: the others may not share its disk.
  std::string from = opts.resume().empty() ? "" : detail::broadcast_bytes(pg, opts.resume_path(), 0);
  std::string why;
  // A requeued or restarted job continues from its own checkpoint, if it got
  // as far as writing one; so does --resume auto, which otherwise starts fresh.
  const std::string restart = restart_reason();
  const bool auto_resume = opts.resume() == "auto";
  if (!restart.empty() || auto_resume) {
    // The run folder's newest checkpoint, as rank 0 sees it: the others may not share its disk.
    std::string found =
        detail::broadcast_bytes(pg, pg.rank() == 0 ? detail::newest_checkpoint(run.path()) : std::string(), 0);
    if (!found.empty()) {
      from = std::move(found);
      if (!restart.empty()) why = " (" + restart + ": the job was requeued, restarted or rescaled)";
    } else if (auto_resume) {
      from.clear();
      run.log("--resume auto: no checkpoint in " + opts.run_dir() + " yet; starting fresh");
    }
  }
  if (!from.empty()) {
    // Sets last_checkpoint: the file used. Every rank checks the same config, so all refuse alike.
    state = load_checkpoint(from, model, &optimizer, pg, scaler,
                            [&](const std::map<std::string, std::string>& config, const std::string& file) {
                              opts.check_resume(config, file, pg.rank() == 0);
                            });
    state.last_checkpoint_epoch = state.epoch;
    if (state.epoch > opts.epochs())
      throw CheckpointError(rank_tag(pg) + ": " + state.last_checkpoint + " is after " + std::to_string(state.epoch) +
                            " epochs, more than --epochs " + std::to_string(opts.epochs()) +
                            " asks for in all: raise --epochs to train on, or give another --run-dir to start afresh");
    run.log("resumed from " + state.last_checkpoint + " after " + position(state) + why);
  }
  run.start(state.epoch);
  return state;
}

}  // namespace

TrainState resume_or_start(const TrainOptions& opts, RunDir& run, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, ProcessGroup& pg, GradScaler* scaler) {
  auto* recoverable = dynamic_cast<RecoverableGroup*>(&pg);
  TrainState state = recoverable && recoverable->joining()
                         ? join_running_group(*recoverable, run, model, optimizer, scaler)
                         : start_or_load(opts, run, model, optimizer, pg, scaler);
  state.scaler = scaler;
  state.run = &run;
  state.model = &model;
  state.optimizer = &optimizer;
  state.config = opts.to_config();
  if (recoverable && opts.checkpoint_every_steps() > 0)
    throw UsageError(rank_tag(pg) + ": --checkpoint-every-steps is not taken under ddprun --recover-in-process, "
                     "where a lost rank costs one step: checkpoint at epochs' ends (--checkpoint-every)");
  if (!recoverable) state.writer = std::make_shared<CheckpointWriter>(pg, detail::kit_layout(run, optimizer, pg));
  if (opts.tensorboard()) run.open_tensorboard(state.step + 1, state.config);
  if (opts.preemption_check_every() > 0) {
    // SIGUSR1: Slurm's warning. SIGTERM: how ddprun and torchrun stop the
    // workers when a node joins or leaves (SIGKILL follows after
    // --term-timeout), and Slurm's at the end: either way the epoch's work
    // is saved at the next agreed step instead of lost.
    watch_preemption_signal(SIGUSR1);
    watch_preemption_signal(SIGTERM);
    state.checkpoint_and_stop = [&run, &model, &optimizer, &pg](const TrainState& s) {
      const std::string path = detail::kit_checkpoint_path(run, s);
      run.log("preemption warning (" + signal_name(preemption_signal_received()) +
              "): checkpoint after " + position(s) + ", then exit status " +
              std::to_string(kPreemptedExitCode) + " so that the job is requeued");
      if (s.writer) {  // after the save in flight, which save() waits for
        s.writer->save(path, model, optimizer, s);
        s.writer->wait();
      } else {
        save_checkpoint(path, model, optimizer, s, pg);
      }
      throw Preempted(rank_tag(pg) + ": stopped for preemption after " + position(s) + "; " + path +
                      " holds the state, and the requeued job resumes from it");
    };
  }
  return state;
}

}  // namespace ddp
