// TensorBoard event files, as PyTorch's torch.utils.tensorboard.SummaryWriter
// writes them, from C++: scalars, histograms, text and hyperparameters that
// `tensorboard --logdir` shows. The training kit writes one into every run
// folder (--tensorboard, on by default); any program can make its own:
//
//   ddp::SummaryWriter tb("runs/exp1");
//   tb.add_scalar("train/loss", loss, step);
//   tb.add_scalars("loss", {{"train", 0.5}, {"test", 0.6}}, step);  // runs/exp1/loss_train/, loss_test/
//   tb.add_histogram("fc1.weight", net->fc1->weight, step);           // PyTorch's default ('tensorflow') buckets
//   tb.add_text("notes", "lr halved", step);
//   tb.add_hparams({{"lr", 0.1}, {"optimizer", "sgd"}}, {{"hparam/accuracy", 0.91}});
//
// Files are named and laid out as PyTorch's (events.out.tfevents.<time>.<host>.<pid>.<n>,
// first record the file_version event "brain.Event:2"), in TFRecord framing.
// Records are buffered and written out at flush(), at close(), and every
// flush_secs (30 s; PyTorch's flush_secs is 120): what was written out before
// a crash of the process is readable after it (the file is not fsynced: a
// power loss may lose the tail; a torn last record is skipped by TensorBoard).
// A write that fails (a full disk, a file that cannot be created, a link
// where a file or folder goes) stops this writer with one warning on stderr
// naming the file and the error; every later call does nothing, and nothing
// is thrown: the training goes on without events. A tag TensorBoard cannot
// take (empty, or not UTF-8) is a UsageError naming it.
// Calls may come from several threads: one lock orders the records (and the
// writer's own flushing thread).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ddp {

struct SummaryWriterOptions {
  // Seconds between automatic flushes (PyTorch: flush_secs, 120 there).
  SummaryWriterOptions& flush_secs(double s) { flush_secs_ = s; return *this; }
  double flush_secs() const { return flush_secs_; }
  // PyTorch's purge_step: the file starts with a SessionLog START at this
  // step, and TensorBoard drops every earlier record of the run folder whose
  // step is >= it (a resumed run's steps replace the crashed run's).
  SummaryWriterOptions& purge_step(std::optional<int64_t> s) { purge_step_ = s; return *this; }
  std::optional<int64_t> purge_step() const { return purge_step_; }
  // Appended to every event file's name (PyTorch: filename_suffix).
  SummaryWriterOptions& filename_suffix(std::string s) { filename_suffix_ = std::move(s); return *this; }
  const std::string& filename_suffix() const { return filename_suffix_; }

 private:
  double flush_secs_ = 30;
  std::optional<int64_t> purge_step_;
  std::string filename_suffix_;
};

// A hyperparameter's value: a number (bools and integers too, as PyTorch
// writes them: True is 1.0) or a string.
class HParamValue {
 public:
  HParamValue(double v) : v_(v) {}                             // NOLINT: implicit, as a Python value
  HParamValue(int v) : v_(static_cast<double>(v)) {}           // NOLINT
  HParamValue(int64_t v) : v_(static_cast<double>(v)) {}       // NOLINT
  HParamValue(bool v) : v_(v ? 1.0 : 0.0) {}                   // NOLINT
  HParamValue(const char* v) : v_(std::string(v)) {}           // NOLINT
  HParamValue(std::string v) : v_(std::move(v)) {}             // NOLINT
  const std::variant<double, std::string>& value() const { return v_; }

 private:
  std::variant<double, std::string> v_;
};

class SummaryWriter {
 public:
  // Creates log_dir (and its parents) and its event file, whose first
  // records (file_version; the purge step's) are written out at once, as
  // PyTorch's. An empty log_dir is PyTorch's default,
  // runs/<Mon dd_HH-MM-SS>_<host>. flush_secs <= 0 is a UsageError.
  explicit SummaryWriter(std::string log_dir = "", SummaryWriterOptions options = {});
  ~SummaryWriter();  // close()
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  const std::string& log_dir() const;

  // The value as a float (simple_value), NaN and infinities as they are.
  // walltime: seconds since the epoch; the current time if not given.
  void add_scalar(const std::string& tag, double value, int64_t global_step = 0,
                  std::optional<double> walltime = std::nullopt);
  // One scalar per key, each in its own folder <log_dir>/<main_tag>_<key>
  // ('/' in main_tag becomes '_'), under the tag main_tag. A key that is
  // empty, ".", "..", or holds '/' or a NUL is a UsageError.
  void add_scalars(const std::string& main_tag, const std::map<std::string, double>& values, int64_t global_step = 0,
                   std::optional<double> walltime = std::nullopt);
  // A histogram over PyTorch's default buckets (bins='tensorflow': edges
  // 0, ±1e-12 * 1.1^k up to 1e20), trimmed to the buckets holding values as
  // PyTorch's make_histogram trims them. Any dtype or shape, any device
  // (copied to the CPU as float64). No values, or NaN or an infinity among
  // them, is a UsageError (PyTorch raises ValueError).
  void add_histogram(const std::string& tag, const at::Tensor& values, int64_t global_step = 0,
                     std::optional<double> walltime = std::nullopt);
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t global_step = 0,
                     std::optional<double> walltime = std::nullopt);
  // Text (markdown) under <tag>/text_summary, as PyTorch's add_text.
  void add_text(const std::string& tag, const std::string& text, int64_t global_step = 0,
                std::optional<double> walltime = std::nullopt);
  // As PyTorch's add_hparams: in <log_dir>/<run_name> (run_name: the wall
  // time as Python's str(time.time()) when empty), the HParams plugin's
  // experiment, session start (the values) and session end (success)
  // records, then each metric as a scalar. The plugin's table shows one row
  // per such folder.
  void add_hparams(const std::map<std::string, HParamValue>& hparams, const std::map<std::string, double>& metrics,
                   const std::string& run_name = "", int64_t global_step = 0);

  // Writes every buffered record out (to the OS: it survives a crash of the
  // process, not of the machine). Does nothing after a failure.
  void flush();
  // Flushes and closes every file; later calls do nothing.
  void close();
  // Whether a write failed and the writer stopped (it warned once).
  bool failed() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ddp
