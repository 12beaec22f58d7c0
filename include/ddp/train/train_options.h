// The command line every example shares (Boost.ProgramOptions), with each
// example's own defaults and, optionally, its own extra options:
//
//   auto opts = ddp::parse_train_options(argc, argv,
//       ddp::TrainOptions().epochs(10).global_batch_size(256).lr(0.2).run_dir("runs/lenet_fmnist"));
//   int64_t batch = opts.per_process_batch(pg->size());
//
// --help prints the options and exits 0; a bad option throws ddp::UsageError.
//
// A program adds its own options (argparse's add_argument: a name, a default
// whose type is the option's, a help line), reads them back after parsing,
// and says which of the kit's options it implements; the others are then
// unknown options, as any misspelt one:
//
//   auto opts = ddp::parse_train_options(argc, argv, ddp::TrainOptions().epochs(20).lr(3e-3)
//       .add_option("dim", 256, "embedding width")                      // checked on resume
//       .add_option("sample-len", 200, "characters sampled after each epoch", ddp::OnResume::may_change)
//       .supports({"epochs", "batch-size", "lr", "seed", "run-dir", "resume"}));
//   const int64_t dim = opts.get<int64_t>("dim");
#pragma once

#include <boost/program_options.hpp>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "ddp/parallel/ddp_options.h"
#include "ddp/errors.h"
#include "ddp/comm/process_group.h"

namespace ddp {

// Whether a program's option may take another value when a run resumes.
enum class OnResume {
  // It shapes the model or what it learns from (--dim, --seq-len): a resume
  // with another value than the checkpoint recorded is a UsageError naming
  // the option and both values.
  must_match,
  // Like the kit's own options (--epochs, --lr, batch sizes): a resume takes
  // the new value.
  may_change,
};

// One option a program registered with TrainOptions::add_option.
struct ProgramOption {
  using Value = std::variant<int64_t, double, std::string, bool>;
  std::string name;  // as on the command line, without "--": "seq-len"
  Value value;       // the default, then what the command line gave
  std::string help;
  OnResume on_resume = OnResume::must_match;
  // Its key in the checkpoint's config: "seq_len" (argparse's dest).
  std::string config_key() const;
  // Its value as the config records it: shortest round-trip numbers, "1"/"0".
  std::string text() const;
};

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
  // Under ddprun --recover-in-process: seconds a silent rank may stay
  // silent before the others go on without it (RecoveryOptions::deadline).
  TORCH_ARG(double, recovery_deadline_s) = 30;
  TORCH_ARG(std::string, data_dir) = "";
  TORCH_ARG(std::string, run_dir) = "runs/run";
  // Checkpoint every N epochs (and after the last); 0: only after the last.
  // Where: <run-dir>/checkpoint/, every rank writing its part in the
  // background, or <run-dir>/checkpoint.pt when the ranks do not share the
  // run folder (ddp::resume_or_start).
  TORCH_ARG(int64_t, checkpoint_every) = 1;
  // Also every N optimizer steps, inside epochs (the position inside the
  // epoch saved, as a preemption checkpoint's); 0: only at epochs' ends.
  TORCH_ARG(int64_t, checkpoint_every_steps) = 0;
  // A checkpoint (a file, or a sharded checkpoint's folder) or a run folder
  // (its newest checkpoint) to continue from; "" for a fresh start; "auto"
  // (--resume alone): the run folder's newest checkpoint if it has one, else
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
  // Write the DDP timeline of the run (a Chrome trace, ddp/observe/timeline.h) to
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
  // Mixed precision (--amp [auto|fp16|bf16]): forward and loss under
  // ddp::Autocast to amp_dtype, float16 with a ddp::GradScaler, bfloat16
  // without one (its range is float32's), as PyTorch's AMP recipe.
  // "auto": float16 on CUDA, bfloat16 on CPU. float16 is for GPUs only.
  TORCH_ARG(bool, amp) = false;
  TORCH_ARG(std::string, amp_dtype) = "auto";
  // Record which samples every step trained on, in
  // <run-dir>/samples/rank<R>.txt (ddp/train/epoch_loop.h says the format):
  // an audit of the data order, across resumes and world-size changes.
  TORCH_ARG(bool, log_samples) = false;
  // TensorBoard event files in the run folder (ddp/train/summary_writer.h;
  // `tensorboard --logdir runs/`): --tensorboard (the default) or
  // --no-tensorboard. Every program has both switches.
  TORCH_ARG(bool, tensorboard) = true;

 public:
  // What --amp autocasts to on `device`, "auto" resolved: Half or BFloat16;
  // a UsageError for float16 on a CPU. The loss scaler is for Half only:
  //   const auto dtype = opts.autocast_dtype(device);
  //   ddp::GradScaler scaler(pg, ddp::GradScalerOptions().enabled(opts.amp() && dtype == torch::kHalf));
  //   ... { ddp::Autocast autocast(device.type(), dtype, opts.amp()); loss = ...; }
  c10::ScalarType autocast_dtype(const c10::Device& device) const;

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
  // The checkpoint --resume names, as this process sees it: a run folder
  // means the newer of its checkpoint.pt and checkpoint/ (its checkpoint.pt
  // when it has neither); "" when not resuming.
  std::string resume_path() const;
  ProcessGroupOptions process_group_options() const;
  DDPOptions ddp_options() const;
  // The run's group: init_process_group(process_group_options()), or, when
  // ddprun --recover-in-process started the process, a recoverable group
  // (ddp/comm/recovery.h) with --recovery-deadline, over Gloo: then a rank
  // lost inside train_epoch costs the others one step, not the run.
  std::shared_ptr<ProcessGroup> init_process_group() const;
  // Batches per epoch for `samples` per rank: ceil(samples / batch), capped
  // so that `taken` (batches of the epoch taken before a resume) plus them
  // stay within --limit-batches.
  int64_t steps_per_epoch(size_t samples, int64_t batch, int64_t taken = 0) const;
  // Whether to write a checkpoint after `completed` epochs (--checkpoint-every, and always after the last).
  bool checkpoint_due(int64_t completed) const;
  // Every option as text, for checkpoints and logs: the kit's and the
  // program's (add_option), by config key.
  std::map<std::string, std::string> to_config() const;

  // ---- the program's own options ------------------------------------------
  // Registers --name with its default and help line; the default's type is
  // the option's: an integer (int64_t), a floating-point number (double), a
  // string, or a bool (a switch, off by default: argparse's store_true).
  // parse_train_options parses it (a non-finite number is a UsageError),
  // --help lists it, to_config() records it, and resume_or_start refuses a
  // resume that changes a must_match one. UsageError for a name that is not
  // [a-z0-9-], is registered twice or is one of the kit's options.
  template <typename T>
  TrainOptions& add_option(const std::string& name, T default_value, std::string help,
                           OnResume on_resume = OnResume::must_match) {
    if constexpr (std::is_same_v<T, bool>)
      return add_program_option({name, default_value, std::move(help), on_resume});
    else if constexpr (std::is_integral_v<T>)
      return add_program_option({name, static_cast<int64_t>(default_value), std::move(help), on_resume});
    else if constexpr (std::is_floating_point_v<T>)
      return add_program_option({name, static_cast<double>(default_value), std::move(help), on_resume});
    else if constexpr (std::is_convertible_v<T, std::string>)
      return add_program_option({name, std::string(default_value), std::move(help), on_resume});
    else
      static_assert(std::is_same_v<T, bool>, "an option is an integer, a floating-point number, a string or a bool");
  }
  // A registered option's value, as its type: int64_t, double, std::string
  // or bool. UsageError if `name` is not registered or is of another type.
  template <typename T>
  T get(const std::string& name) const {
    const auto& option = program_option(name);
    if (const T* v = std::get_if<T>(&option.value)) return *v;
    const char* asked = std::is_same_v<T, bool>      ? "bool"
                        : std::is_same_v<T, int64_t> ? "int (int64_t)"
                        : std::is_same_v<T, double>  ? "float (double)"
                                                     : "str (std::string)";
    throw UsageError("option --" + name + " is " + type_name(option) + ", not " + asked + ": read it as its own type");
  }
  const std::vector<ProgramOption>& program_options() const { return program_; }
  std::vector<ProgramOption>& program_options() { return program_; }
  const ProgramOption& program_option(const std::string& name) const;

  // ---- which of the kit's options the program implements ------------------
  // The kit's options by name without "--" ("epochs", "data-dir", "amp"):
  // only these and --help are accepted and listed in --help; any other kit
  // option is an unknown option. Without this call every kit option is
  // accepted (the behaviour before it existed; docs/training.md, "Against Python's argparse", says why).
  // UsageError for a name that is not a kit option.
  TrainOptions& supports(const std::vector<std::string>& kit_options);
  // The names supports() declared; nullopt: every kit option.
  const std::optional<std::set<std::string>>& supported() const { return supported_; }
  // Every kit option's name, in --help's order ("help" first).
  static const std::vector<std::string>& kit_options();

  // The program's must_match options against what `checkpoint` recorded:
  // UsageError naming the option and both values for the first that
  // differs. An option the checkpoint does not record (written before the
  // program had it) is not checked; rank 0 says so.
  void check_resume(const std::map<std::string, std::string>& recorded, const std::string& checkpoint,
                    bool notify = true) const;

 private:
  TrainOptions& add_program_option(ProgramOption option);
  static std::string type_name(const ProgramOption& option);
  std::vector<ProgramOption> program_;
  std::optional<std::set<std::string>> supported_;
};

// Parses argv over `defaults`: the kit's options (those defaults.supports()
// allows) and the program's (add_option). `extra` adds options bound to the
// program's own variables (Boost.ProgramOptions), neither recorded nor
// checked on resume: add_option is the way for new code. --help prints
// usage on stdout (defaults in their shortest round-trip form: 0.003) and exits 0.
TrainOptions parse_train_options(int argc, char** argv, TrainOptions defaults = {},
                                 const boost::program_options::options_description* extra = nullptr);

}  // namespace ddp
