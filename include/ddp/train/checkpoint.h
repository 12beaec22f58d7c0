// Training checkpoints: everything --resume needs to continue a run as if it
// had never stopped, in one file that Python's torch.load reads too.
//
// Rank 0 writes it atomically (a temporary file, fsync, rename, fsync of the
// directory) after keeping the previous one as <name>.prev.pt; the other ranks
// wait for its verdict (the process group's timeout bounds the wait). A crash
// at any moment leaves a complete checkpoint behind.
//
// Contents (a dict): "model" (name -> tensor, no `module.` prefix),
// "optimizer" (LibTorch's optimizer archive, as bytes in a uint8 tensor),
// "scaler" (an enabled ddp::GradScaler's state_dict(), as PyTorch's dict),
// "epoch", "step", "sampler_epoch", "epoch_step", "epoch_samples", "world_size", "rng_states" (every rank's
// CPU generator), "config" (name -> string: the kit's options and the
// program's, TrainOptions::add_option), "extra" (the program's own entries,
// TrainState::extra), "format" and "version".
//
//   ddp::save_checkpoint(run.checkpoint_path(), *net, optimizer, state, *pg);
//   auto state = ddp::load_checkpoint(path, *net, &optimizer, *pg);  // collective
//
// With float16 mixed precision, give the scaler to resume_or_start (or
// load_checkpoint) and it travels with the checkpoint:
//
//   ddp::GradScaler scaler(pg, ddp::GradScalerOptions().enabled(opts.amp() && opts.autocast_dtype(device) == torch::kHalf));
//   auto state = ddp::resume_or_start(opts, run, *net, optimizer, *pg, &scaler);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "ddp/amp/grad_scaler.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/state_dict.h"

namespace ddp {

class CheckpointWriter;
class RunDir;
struct TrainOptions;

struct TrainState {
  int64_t epoch = 0;          // epochs completed
  int64_t step = 0;           // optimizer steps taken
  int64_t sampler_epoch = 0;  // the epoch the sampler shuffles for next
  // Batches of epoch `epoch` already taken (per rank, counting every run
  // of the epoch): above 0 only inside an epoch and in a checkpoint written
  // there (preemption); --limit-batches counts them.
  int64_t epoch_step = 0;
  // Positions of epoch `epoch`'s permutation already taken by all ranks
  // together: where the epoch resumes, at any world size
  // (DistributedSampler::set_start). Always a step boundary: no batch is
  // ever partly taken.
  int64_t epoch_samples = 0;
  int world_size = 1;         // of the run that wrote it
  std::map<std::string, std::string> config;
  // The program's own state, saved under "extra" and given back on resume
  // (Python: torch.load(path)["extra"]): a scheduler's state, the best loss,
  // anything made of tensors, numbers, strings, bools, None, lists, tuples
  // and dicts with str or int keys (nested at most pickle::kMaxNesting deep):
  //   state.extra["best_loss"] = best_loss;
  //   best_loss = state.extra.count("best_loss") ? state.extra.at("best_loss").toDouble() : INFINITY;
  // Lists come back typed where every item has one type (List[int],
  // List[float], List[bool], List[str], List[Tensor]), else List[Any]; dicts
  // as Dict[str, Any] (or Dict[int, Any]); tensors on the CPU. Anything else
  // (a custom class, a Python object in a file) is a CheckpointError naming
  // the entry. Keep it current: a preemption checkpoint inside an epoch
  // saves what it holds at that step.
  std::map<std::string, c10::IValue> extra;
  // Not saved. Set by resume_or_start() when the run watches for preemption
  // (ddp/train/preemption.h): writes the checkpoint for this state and throws
  // ddp::Preempted. train_epoch() calls it at the step all ranks agreed on.
  std::function<void(const TrainState&)> checkpoint_and_stop;
  // Not saved. The checkpoint this run last wrote or resumed from ("" when
  // none yet) and the epochs it covers: what a NaN loss error points to.
  std::string last_checkpoint;
  int64_t last_checkpoint_epoch = 0;
  // Not owned. The run's loss scaler, if any (resume_or_start sets it): its
  // state_dict() is saved with every checkpoint while it is enabled.
  GradScaler* scaler = nullptr;
  // Not saved, not owned. The run folder (resume_or_start sets it):
  // train_epoch() logs there where a resumed epoch goes on.
  RunDir* run = nullptr;
  // Not saved, not owned. The model and optimizer resume_or_start was given:
  // what train_epoch hands a rank that joins a recoverable group.
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  // Not saved. The kit's background writer (resume_or_start sets it; none
  // under ddprun --recover-in-process, where the kit writes on the training
  // thread): end_epoch and --checkpoint-every-steps save through it, and the
  // preemption checkpoint waits for its last save first.
  std::shared_ptr<CheckpointWriter> writer;
};

// An empty str -> any dict for TrainState::extra's nested entries (LibTorch
// cannot make an empty c10::Dict<std::string, c10::IValue>):
//   auto scheduler = ddp::extra_dict();
//   scheduler.insert("last_epoch", epoch);
//   state.extra["scheduler"] = scheduler;
c10::impl::GenericDict extra_dict();

// Collective. Rank 0 writes `path`; every rank returns once it is on disk,
// or throws CheckpointError (rank 0: why; others: that rank 0 failed). The
// new file replaces `path` only once written, synced and read back whole;
// the old `path` becomes <name>.prev.pt only if it is whole itself (a
// damaged newest checkpoint never replaces the good previous one). A
// ddp::ZeroRedundancyOptimizer is consolidated to rank 0 first, and the
// checkpoint holds the whole state, as the unsharded optimizer's; loading
// gives each rank its share again, at any world size.
void save_checkpoint(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                     const TrainState& state, ProcessGroup& pg);

// Collective. The checkpoint as a folder `dir` in which every rank writes
// the part it owns, all at once (PyTorch's torch.distributed.checkpoint):
// each optimizer parameter's value and state by one rank (under a
// ZeroRedundancyOptimizer the rank whose shard holds it, with nothing
// gathered), buffers by the least loaded, then a small manifest by rank 0,
// written last, which makes the save visible; the save before it stays
// (manifest.prev.pt) and older ones are removed. Each rank's extra memory
// is a host copy of its own part. `dir` must be one folder every rank
// writes and, to resume, reads (a shared file system). The optimizers it
// takes apart are SGD, Adam, AdamW, Adagrad and RMSprop (ZeRO over them
// too); another is a UsageError: save it with save_checkpoint. load_checkpoint
// reads it at any world size, each rank only what it keeps;
// export_checkpoint makes the one file save_checkpoint writes.
void save_sharded_checkpoint(const std::string& dir, const torch::nn::Module& model,
                             const torch::optim::Optimizer& optimizer, const TrainState& state, ProcessGroup& pg);

// Not collective, one process: the sharded checkpoint `dir` as the one file
// save_checkpoint writes (Python's torch.load reads it; a ZeRO optimizer's
// state whole, as after consolidate_state_dict), written atomically.
// CheckpointError for a damaged or crafted folder.
void export_checkpoint(const std::string& dir, const std::string& file);

// How a CheckpointWriter writes: one file by rank 0 (save_checkpoint's), or
// a folder every rank writes its part into (save_sharded_checkpoint's).
enum class CheckpointLayout { single_file, sharded };

// save_checkpoint off the training thread (PyTorch's async_save): save()
// stages the state on rank 0 (copies of the model's tensors and the
// optimizer's state into host buffers kept from one save to the next,
// page-locked for a GPU's) and returns; a thread of its own pickles, writes,
// syncs, reads back and rotates the file as save_checkpoint does. The file
// is the one save_checkpoint writes for the same state, byte for byte.
//
//   ddp::CheckpointWriter writer(*pg);
//   writer.save(run.checkpoint_path(), *net, optimizer, state);  // collective; training goes on
//   ...
//   writer.wait();  // collective: on disk, or CheckpointError on every rank
//
// Training waits only where a save begins before the last one is written.
// A failed write (disk full, the folder gone) is a CheckpointError naming
// the file at the next save() or wait(), on every rank, and leaves the
// checkpoint before it as it was. A ZeroRedundancyOptimizer is consolidated
// first, on the training thread (collective). The optimizers staged without
// serializing are SGD, Adam, AdamW, Adagrad and RMSprop; another is
// serialized on the training thread.
//
// CheckpointLayout::sharded: save(dir, ...) stages this rank's part on every
// rank, and each rank's thread writes it; rank 0's writes the manifest once
// every rank's part is on disk (they tell it through the group's store; a
// group without one tells it at the next save() or wait()).
class CheckpointWriter {
 public:
  explicit CheckpointWriter(ProcessGroup& pg, CheckpointLayout layout = CheckpointLayout::single_file);
  // Waits for a write still going; a failure is printed, not thrown (call
  // wait() to have it thrown).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective: wait(), then the state staged and its write started.
  void save(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
            const TrainState& state);
  // Collective: the last save is on disk; CheckpointError on every rank if
  // its write failed.
  void wait();
  // Whether a save's verdict is still to come (this rank; not collective).
  bool busy() const;
  // The layout it was made with.
  CheckpointLayout layout() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Collective. A folder that save_sharded_checkpoint wrote: each rank reads
// from its shards what it keeps, straight into its tensors (the model whole;
// the optimizer's state whole, or under ZeRO its own share at this world
// size), falling back to the save before it when the newest does not read
// whole on every rank; one of its manifests (<dir>/manifest.prev.pt: the
// save before the newest), that save alone. A file: rank 0 reads `path` (falling back to
// <name>.prev.pt with a notice if `path` is unreadable) and broadcasts it, so the other ranks need
// no shared file system; the returned state's last_checkpoint names the file
// used. Nothing in the file is run: the optimizer's archive is read as data
// (ddp::read_archive), and every count is range-checked. Restores the model (prefixes stripped, tensors to
// the model's device), the optimizer (if given) and this rank's RNG state;
// returns the rest. Another world size works, with a notice on rank 0: the
// data position carries over exactly (epoch_samples: the epoch's samples not
// yet taken go to the new ranks), RNG states are reused round-robin, and a
// ZeroRedundancyOptimizer takes its share of the consolidated state.
// An enabled `scaler` gets the checkpoint's scaler state (a checkpoint
// without one, from a run without float16, leaves it at its initial scale,
// with a notice); the returned state points to it.
TrainState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                           ProcessGroup& pg, GradScaler* scaler = nullptr);
// The same, calling check_config(config, file) with the checkpoint's
// "config" before anything is restored (resume_or_start refuses a changed
// must_match option there, before the model reports a shape mismatch).
TrainState load_checkpoint(
    const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer, ProcessGroup& pg,
    GradScaler* scaler,
    const std::function<void(const std::map<std::string, std::string>& config, const std::string& file)>& check_config);

// The previous checkpoint kept next to `path`: dir/checkpoint.pt -> dir/checkpoint.prev.pt.
std::string previous_checkpoint_path(const std::string& path);

// Where training starts: with --resume, the checkpoint's model, optimizer,
// epoch, step, sampler epoch and RNG state (collective; logged to the run),
// else a fresh state. --resume alone (or "auto") takes the run folder's
// checkpoint when it has one (or only its previous one) and starts fresh when
// it has none. A restarted process (restart_reason(): Slurm requeued the
// job, ddprun/torchrun restarted its workers, or ddprun rendezvoused again,
// as after a node joined or left) continues from the run folder's newest
// readable checkpoint when there is one, whatever --resume says (that names
// where the first attempt started). Either way the configuration is
// recorded and metrics.csv keeps only the epochs already done. A resume
// whose program option registered as OnResume::must_match differs from the
// checkpoint's is a UsageError (TrainOptions::check_resume); the
// checkpoint's "extra" comes back in state.extra. Unless
// --preemption-check-every is 0, SIGUSR1 and SIGTERM are watched and
// state.checkpoint_and_stop set (ddp/train/preemption.h). A `scaler` is
// restored with the rest and saved with every checkpoint (state.scaler).
//
// The checkpoints it sets up (state.writer; train_epoch and end_epoch save
// through it): sharded, in the folder <run>/checkpoint, every rank writing
// its part in the background (CheckpointLayout::sharded), when every rank
// sees the run folder as rank 0's (a shared file system: rank 0 leaves a
// file there and every rank looks for it) and the optimizer is one a
// sharded checkpoint takes apart; else the one file <run>/checkpoint.pt by
// rank 0, in the background too. Under ddprun --recover-in-process there is
// no writer: the one file, written on the training thread. The log says
// which, and why. A resume takes whichever of the two was written last.
TrainState resume_or_start(const TrainOptions& opts, RunDir& run, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, ProcessGroup& pg, GradScaler* scaler = nullptr);

// Why this process is a restart, as "NAME=value" of the first of these above
// 0: SLURM_RESTART_COUNT (Slurm requeued the job), TORCHELASTIC_RESTART_COUNT
// (ddprun/torchrun restarted the workers after a failure; torchrun keeps it
// unchanged on a membership change), DDPRUN_RDZV_ROUND (ddprun's rendezvous
// round: every re-rendezvous, after a failure or a membership change); ""
// for a first start. Such a process resumes from its run folder and may run at another
// world size (TrainOptions::per_process_batch).
std::string restart_reason();

}  // namespace ddp
