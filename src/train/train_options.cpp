#include "ddp/train/train_options.h"

#include "ddp/comm/recovery.h"
#include "ddp/runtime/launch_env.h"
#include "ddp/train/checkpoint.h"
#include "train/kit_checkpoint.h"
#include "train/sharded_checkpoint.h"
#include "program_options.h"
#include "runtime/parse_number.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

namespace ddp {

namespace po = boost::program_options;

namespace {

int64_t split_global_batch(const TrainOptions& o, int world_size, int rank) {
  if (o.batch_size() > 0) return o.batch_size();
  if (o.global_batch_size() <= 0) throw UsageError("set --batch-size (per process) or --global-batch-size");
  const int64_t global = o.global_batch_size(), world = world_size;
  if (global % world == 0) return global / world;
  const std::string restart = restart_reason();
  if (restart.empty())
    throw UsageError("--global-batch-size " + std::to_string(global) + " does not divide by the " +
                     std::to_string(world) + " processes; pick a multiple of " + std::to_string(world) +
                     " or set --batch-size per process");
  // A restart at a new world size (a node joined or left): the job must go
  // on, so the nearest global batch below that the ranks share evenly.
  const int64_t batch = std::max<int64_t>(1, global / world);
  if (rank == 0)
    std::cout << "warning: global batch " << batch * world << " = " << world << " x " << batch
              << ", not --global-batch-size " << global << ": " << world << " ranks do not divide it (" << restart
              << ": a restart, possibly at a new world size); the learning rate is unchanged" << std::endl;
  return batch;
}

}  // namespace

int64_t TrainOptions::per_process_batch(int world_size) const {
  int rank = 0;
  try {
    rank = LaunchEnv::from_environment().rank;
  } catch (const std::exception&) {
    // An environment the process group will refuse with a better message.
  }
  return split_global_batch(*this, world_size, rank);
}

int64_t TrainOptions::per_process_batch(const ProcessGroup& pg) const {
  return split_global_batch(*this, pg.size(), pg.rank());
}

std::string TrainOptions::resume_path() const {
  if (resume().empty()) return "";
  // A run folder (--resume alone: this run's) means its newest checkpoint,
  // the one file or the sharded folder; a sharded checkpoint's own folder
  // (it holds a manifest) itself.
  const std::string where = resume() == "auto" ? run_dir() : resume();
  if (resume() == "auto" || (std::filesystem::is_directory(where) && !detail::is_sharded_checkpoint(where))) {
    const std::string newest = detail::newest_checkpoint(where);
    return newest.empty() ? (std::filesystem::path(where) / "checkpoint.pt").string() : newest;
  }
  return where;
}

int64_t TrainOptions::steps_per_epoch(size_t samples, int64_t batch, int64_t taken) const {
  int64_t steps = (static_cast<int64_t>(samples) + batch - 1) / batch;
  if (limit_batches() >= 0) steps = std::min(steps, std::max<int64_t>(0, limit_batches() - taken));
  return steps;
}

bool TrainOptions::checkpoint_due(int64_t completed) const {
  return completed == epochs() || (checkpoint_every() > 0 && completed % checkpoint_every() == 0);
}

std::shared_ptr<ProcessGroup> TrainOptions::init_process_group() const {
  if (!recovery_launched()) return ddp::init_process_group(process_group_options());
  if (backend() == "mpi")
    throw UsageError("--backend mpi under ddprun --recover-in-process: in-process recovery re-forms Gloo and NCCL "
                     "groups, not MPI's (an MPI job cannot lose a process and go on); use --backend auto, gloo or nccl");
  if (workers() > 0)
    throw UsageError("--workers " + std::to_string(workers()) + " under ddprun --recover-in-process: a re-formed "
                     "group starts the epoch's data again, which LibTorch's DataLoader cannot while its workers "
                     "hold batches; use --workers 0");
  RecoveryOptions recovery;
  recovery.deadline = std::chrono::milliseconds(static_cast<int64_t>(recovery_deadline_s() * 1000));
  recovery.backend = backend();
  return init_recoverable_group(recovery);
}

ProcessGroupOptions TrainOptions::process_group_options() const {
  return ProcessGroupOptions().backend(backend()).timeout(std::chrono::seconds(timeout_s()));
}

DDPOptions TrainOptions::ddp_options() const {
  return bucket_cap_auto() ? DDPOptions().bucket_cap_mb(std::string("auto")) : DDPOptions().bucket_cap_mb(bucket_cap_mb());
}

const std::vector<std::string>& TrainOptions::kit_options() {
  static const std::vector<std::string> names{
      "help", "epochs", "batch-size", "global-batch-size", "lr", "seed", "backend", "bucket-cap-mb", "timeout",
      "recovery-deadline", "data-dir", "run-dir", "checkpoint-every", "checkpoint-every-steps", "resume", "workers", "limit-batches", "timeline",
      "timeline-skew-every", "preemption-check-every", "nonfinite-loss", "amp", "log-samples", "tensorboard",
      "no-tensorboard"};
  return names;
}

std::map<std::string, std::string> TrainOptions::to_config() const {
  const auto str = detail::shortest_text;
  std::map<std::string, std::string> config{{"epochs", std::to_string(epochs())},
          {"batch_size", std::to_string(batch_size())},
          {"global_batch_size", std::to_string(global_batch_size())},
          {"lr", str(lr())},
          {"seed", std::to_string(seed())},
          {"backend", backend()},
          {"bucket_cap_mb", bucket_cap_auto() ? std::string("auto") : str(bucket_cap_mb())},
          {"timeout_s", std::to_string(timeout_s())},
          {"recovery_deadline_s", str(recovery_deadline_s())},
          {"data_dir", data_dir()},
          {"run_dir", run_dir()},
          {"checkpoint_every", std::to_string(checkpoint_every())},
          {"checkpoint_every_steps", std::to_string(checkpoint_every_steps())},
          {"resume", resume()},
          {"workers", std::to_string(workers())},
          {"limit_batches", std::to_string(limit_batches())},
          {"preemption_check_every", std::to_string(preemption_check_every())},
          {"timeline", timeline() ? "1" : "0"},
          {"timeline_skew_every", std::to_string(timeline_skew_every())},
          {"nonfinite_loss", nonfinite_loss()},
          {"amp", amp() ? "1" : "0"},
          {"amp_dtype", amp_dtype()},
          {"log_samples", log_samples() ? "1" : "0"},
          {"tensorboard", tensorboard() ? "1" : "0"}};
  for (const auto& o : program_) config[o.config_key()] = o.text();
  return config;
}

c10::ScalarType TrainOptions::autocast_dtype(const c10::Device& device) const {
  if (amp_dtype() == "bf16") return c10::ScalarType::BFloat16;
  if (amp_dtype() == "fp16" && !device.is_cuda())
    throw UsageError("--amp fp16 is for GPUs (float16 autocast with a loss scaler); on CPUs use --amp bf16");
  if (amp_dtype() != "auto" && amp_dtype() != "fp16")
    throw UsageError("amp_dtype must be auto, fp16 or bf16, not '" + amp_dtype() + "'");
  return device.is_cuda() ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

namespace {

// "--amp bf16" as "--amp=bf16": Boost gives an option with an implicit
// value only a value joined to it, and would read the word as a stray
// positional argument.
std::vector<std::string> join_amp_value(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--amp" && i + 1 < argc && std::string(argv[i + 1]).rfind("-", 0) != 0) {
      args.push_back(arg + "=" + argv[++i]);
    } else {
      args.push_back(arg);
    }
  }
  return args;
}

// What the command line said where `o` cannot hold it as given: read once parsed.
struct KitText {
  std::string bucket_cap, amp;
  bool tensorboard = false, no_tensorboard = false;
};

// The kit's options, bound to `o` and `text`.
void add_kit_options(po::options_description& kit, TrainOptions& o, KitText& text) {
  std::string& bucket_cap = text.bucket_cap;
  std::string& amp = text.amp;
  // clang-format off
  kit.add_options()
    ("help,h", "print this help and exit")
    ("epochs", po::value(&o.epochs())->default_value(o.epochs()), "epochs to train (in all, counting resumed ones)")
    ("batch-size", po::value(&o.batch_size())->default_value(o.batch_size()),
       "samples per process and step (0: --global-batch-size / processes)")
    ("global-batch-size", po::value(&o.global_batch_size())->default_value(o.global_batch_size()),
       "samples per step over all processes")
    ("lr", po::value(&o.lr())->default_value(o.lr(), detail::shortest_text(o.lr())), "learning rate")
    ("seed", po::value(&o.seed())->default_value(o.seed()), "seed of the model's initialisation and the data order")
    ("backend", po::value(&o.backend())->default_value(o.backend()), "auto, gloo, nccl or mpi (mpi: started by mpirun, in builds with MPI)")
    ("bucket-cap-mb", po::value(&bucket_cap)->default_value(bucket_cap),
       "DDP gradient bucket size in MiB, or auto (tried over the first steps, the fastest kept)")
    ("timeout", po::value(&o.timeout_s())->default_value(o.timeout_s()), "seconds any collective may wait")
    ("recovery-deadline",
       po::value(&o.recovery_deadline_s())->default_value(o.recovery_deadline_s(),
                                                          detail::shortest_text(o.recovery_deadline_s())),
       "under ddprun --recover-in-process: seconds a silent rank may stay silent before the others go on without it")
    ("data-dir", po::value(&o.data_dir())->default_value(o.data_dir()), "where the data set lives")
    ("run-dir", po::value(&o.run_dir())->default_value(o.run_dir()),
       "run folder: metrics.csv, log.txt, checkpoint.pt, model.pt, charts")
    ("checkpoint-every", po::value(&o.checkpoint_every())->default_value(o.checkpoint_every()),
       "write a checkpoint every N epochs (0: only after the last)")
    ("checkpoint-every-steps", po::value(&o.checkpoint_every_steps())->default_value(o.checkpoint_every_steps()),
       "also every N optimizer steps, inside epochs (0: off); the kit writes in the background")
    ("resume", po::value(&o.resume())->implicit_value("auto"),
       "continue from a checkpoint file or run folder (alone, or 'auto': --run-dir's checkpoint if there is one, "
       "else a fresh start)")
    ("workers", po::value(&o.workers())->default_value(o.workers()), "data loader threads")
    ("limit-batches", po::value(&o.limit_batches())->default_value(o.limit_batches()),
       "at most N batches per epoch, training and evaluation (-1: all), for quick runs")
    ("timeline", po::bool_switch(&o.timeline()),
     "write the run's DDP timeline (Chrome trace: forward, backward, every bucket, per rank) to "
     "<run-dir>/timeline.json and a rank skew table beside it (as DDP_TIMELINE=<file>)")
    ("timeline-skew-every", po::value(&o.timeline_skew_every())->default_value(o.timeline_skew_every()),
     "with the timeline (turned on by N > 0): print the rank skew table every N steps and keep it in "
     "<run-dir>/timeline.skew.txt (as DDP_TIMELINE_SKEW_EVERY=N)")
    ("preemption-check-every", po::value(&o.preemption_check_every())->default_value(o.preemption_check_every()),
       "every N steps, ask all ranks whether SIGUSR1 (a preemption warning) arrived; if so checkpoint and exit 75 "
       "(0: SIGUSR1 not watched); the ranks also compare their losses then, and at every epoch's end")
    ("nonfinite-loss", po::value(&o.nonfinite_loss())->default_value(o.nonfinite_loss()),
       "when the loss is NaN or infinite on any rank: stop (an error naming the rank, the step and the last good "
       "checkpoint) or continue (a warning)")
    ("amp", po::value(&amp)->implicit_value("auto")->value_name("DTYPE"),
       "mixed precision: --amp (auto: float16 with a loss scaler, ddp::GradScaler, on GPUs; bfloat16 on CPUs), "
       "--amp fp16 (GPUs) or --amp bf16 (no scaler); parameters, gradients and DDP's buckets stay float32")
    ("log-samples", po::bool_switch(&o.log_samples()),
       "record the dataset indices every step trained on, per rank, in <run-dir>/samples/rank<R>.txt")
    ("tensorboard", po::bool_switch(&text.tensorboard),
       "write TensorBoard event files into the run folder (the default): losses, the metric, learning rate, "
       "samples/s, step time, loss scale, DDP's buckets, the environment, the options as hparams; "
       "`tensorboard --logdir <runs>` shows them")
    ("no-tensorboard", po::bool_switch(&text.no_tensorboard), "write no TensorBoard event files");
  // clang-format on
}

po::variables_map parse_command_line(int argc, char** argv, const po::options_description& all) {
  po::variables_map vm;
  try {
    // No positional arguments: a stray word ("--amp yes", "--epochs 3 4") is an error, not ignored.
    const po::positional_options_description none;
    po::store(po::command_line_parser(join_amp_value(argc, argv)).options(all).positional(none).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (see --help)");
  }
  return vm;
}

// One of --batch-size and --global-batch-size: the one given wins.
void settle_batch_sizes(const po::variables_map& vm, TrainOptions& o) {
  const bool batch_given = vm.count("batch-size") && !vm["batch-size"].defaulted();
  const bool global_given = vm.count("global-batch-size") && !vm["global-batch-size"].defaulted();
  if (batch_given && !global_given) o.global_batch_size(0);
  if (global_given && !batch_given) o.batch_size(0);
  if (batch_given && global_given)
    throw UsageError("give --batch-size (per process) or --global-batch-size, not both");
}

// The values' ranges, and --amp's dtype by its names.
void check_values(const po::variables_map& vm, const std::string& amp, TrainOptions& o) {
  if (o.epochs() < 0) throw UsageError("--epochs must be >= 0");
  if (o.batch_size() < 0 || o.global_batch_size() < 0) throw UsageError("batch sizes must be positive");
  // Boost reads "inf" and "nan" as numbers: a run would train on NaN.
  if (!std::isfinite(o.lr()) || o.lr() <= 0)
    throw UsageError("--lr must be a finite number > 0, got " + detail::shortest_text(o.lr()));
  if (o.nonfinite_loss() != "stop" && o.nonfinite_loss() != "continue")
    throw UsageError("--nonfinite-loss must be stop or continue, got '" + o.nonfinite_loss() + "'");
  if (vm.count("amp")) {
    const std::map<std::string, std::string> names = {{"auto", "auto"},  {"fp16", "fp16"}, {"float16", "fp16"},
                                                      {"bf16", "bf16"},  {"bfloat16", "bf16"}};
    const auto it = names.find(amp);
    if (it == names.end()) throw UsageError("--amp takes auto, fp16 or bf16 (or nothing: auto), got '" + amp + "'");
    o.amp(true).amp_dtype(it->second);
  }
  if (o.workers() < 0) throw UsageError("--workers must be >= 0");
  if (o.checkpoint_every() < 0) throw UsageError("--checkpoint-every must be >= 0");
  if (o.checkpoint_every_steps() < 0) throw UsageError("--checkpoint-every-steps must be >= 0");
  if (o.preemption_check_every() < 0) throw UsageError("--preemption-check-every must be >= 0");
  if (o.timeout_s() <= 0) throw UsageError("--timeout must be > 0 seconds");
  if (!std::isfinite(o.recovery_deadline_s()) || o.recovery_deadline_s() < 0.1 || o.recovery_deadline_s() > 86400)
    throw UsageError("--recovery-deadline must be between 0.1 and 86400 seconds, got " +
                     detail::shortest_text(o.recovery_deadline_s()));
  if (o.timeline_skew_every() < 0) throw UsageError("--timeline-skew-every must be >= 0");
}

void set_bucket_cap(const std::string& bucket_cap, TrainOptions& o) {
  if (bucket_cap == "auto") {
    o.bucket_cap_auto(true);
  } else {
    const auto mb = parse_number(bucket_cap);
    if (!mb) throw UsageError("--bucket-cap-mb must be a number of MiB or auto, got '" + bucket_cap + "'");
    o.bucket_cap_mb(*mb).bucket_cap_auto(false);
  }
}

// DistributedDataParallel reads the variable; every rank parses the same
// command line, so all agree.
void export_timeline_variables(const TrainOptions& o) {
  if (o.timeline() && std::getenv("DDP_TIMELINE") == nullptr) {
    const auto file = (std::filesystem::path(o.run_dir()) / "timeline.json").string();
    ::setenv("DDP_TIMELINE", file.c_str(), 1);
  }
  if (o.timeline_skew_every() > 0 && std::getenv("DDP_TIMELINE_SKEW_EVERY") == nullptr)
    ::setenv("DDP_TIMELINE_SKEW_EVERY", std::to_string(o.timeline_skew_every()).c_str(), 1);
}

}  // namespace

TrainOptions parse_train_options(int argc, char** argv, TrainOptions o,
                                 const po::options_description* extra) {
  po::options_description kit("Training options");
  KitText text;
  text.bucket_cap = o.bucket_cap_auto() ? "auto" : detail::shortest_text(o.bucket_cap_mb());
  add_kit_options(kit, o, text);
  // The kit's options the program implements; the others stay unknown.
  po::options_description common("Training options");
  for (const auto& option : kit.options())
    if (!o.supported() || o.supported()->count(option->long_name())) common.add(option);
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "example";
  po::options_description own(program + " options");
  detail::bind_program_options(o.program_options(), own);
  po::options_description all;
  all.add(common);
  if (!o.program_options().empty()) all.add(own);
  if (extra) all.add(*extra);
  const po::variables_map vm = parse_command_line(argc, argv, all);
  if (vm.count("help")) {
    std::cout << "usage: " << program << " [options]\n  start it with: ddprun --nproc-per-node N " << (argc > 0 ? argv[0] : "example")
              << " [options]\n\n"
              << all << std::endl;
    std::exit(0);
  }
  settle_batch_sizes(vm, o);
  detail::check_program_options(o.program_options());
  check_values(vm, text.amp, o);
  if (text.tensorboard && text.no_tensorboard) throw UsageError("give --tensorboard or --no-tensorboard, not both");
  if (text.tensorboard || text.no_tensorboard) o.tensorboard(text.tensorboard);
  if (o.timeline_skew_every() > 0) o.timeline(true);
  set_bucket_cap(text.bucket_cap, o);
  // What the core options refuse (a bucket of 0 MiB, an unknown backend), refused now.
  o.process_group_options();
  o.ddp_options();
  export_timeline_variables(o);
  return o;
}

}  // namespace ddp
