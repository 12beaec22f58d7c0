// RunDir's TensorBoard writer (ddp/train/run_dir.h): opened with the purge
// step and the environment, the epoch's and the steps' records, the
// hyperparameters at the end; and the DDP statistics ddp::optimizer_step notes.
#include "train/run_tensorboard.h"

#include <iostream>

#include "ddp/train/epoch_loop.h"
#include "runtime/parse_number.h"

namespace ddp {

namespace {

// The one run whose writer is open in this process (rank 0): where
// optimizer_step's statistics go. The kit runs one RunDir at a time.
RunDir* g_open_run = nullptr;

// "test_acc" -> "test/acc": TensorBoard groups tags by their first part.
std::string metric_tag(const std::string& name) {
  std::string tag = name;
  const auto at = tag.find('_');
  if (at != std::string::npos) tag[at] = '/';
  return tag;
}

// Markdown shows a table of aligned columns only as code: indented four spaces.
std::string as_code(const std::string& text) {
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

void write_ddp_stats(SummaryWriter& tb, const ReducerStats& s, int64_t step) {
  tb.add_scalar("ddp/num_buckets", static_cast<double>(s.num_buckets), step);
  tb.add_scalar("ddp/bytes_reduced", static_cast<double>(s.bytes_reduced), step);
  tb.add_scalar("ddp/bucket_cap_mb", s.bucket_cap_mb, step);
  tb.add_scalar("ddp/forward_ms", s.mean.forward_ms, step);
  tb.add_scalar("ddp/backward_compute_ms", s.mean.backward_compute_ms, step);
  tb.add_scalar("ddp/comm_ms", s.mean.comm_ms, step);
  tb.add_scalar("ddp/overlap_ms", s.mean.overlap_ms, step);
  tb.add_scalar("ddp/exposed_comm_ms", s.mean.exposed_comm_ms, step);
  tb.add_scalar("ddp/unused_parameter_bytes", static_cast<double>(s.unused_parameter_bytes), step);
  std::vector<double> bytes(s.bucket_bytes.begin(), s.bucket_bytes.end());
  if (!bytes.empty()) tb.add_histogram("ddp/bucket_bytes", bytes, step);
}

}  // namespace

void RunDir::open_tensorboard(int64_t first_step, std::map<std::string, std::string> options) {
  tensorboard_wanted_ = true;
  options_ = std::move(options);
  if (!writer_) return;
  tensorboard_ = std::make_unique<SummaryWriter>(path_, SummaryWriterOptions().purge_step(first_step));
  if (!logged_.empty()) tensorboard_->add_text("environment", as_code(logged_), first_step);
  logged_.clear();
  tensorboard_->flush();
  g_open_run = this;
}

void RunDir::note_ddp_stats(const ReducerStats& stats) { ddp_stats_ = stats; }

void RunDir::close_tensorboard() {
  if (g_open_run == this) g_open_run = nullptr;
  if (!tensorboard_) return;
  std::map<std::string, HParamValue> hparams;
  for (const auto& [key, text] : options_) {
    if (const auto number = parse_number(text))
      hparams.emplace(key, *number);
    else
      hparams.emplace(key, text);
  }
  std::map<std::string, double> metrics;
  if (last_) {
    metrics["hparam/train_loss"] = last_->train_loss;
    metrics["hparam/" + metric_tag("test_loss")] = last_->test_loss;
    metrics["hparam/" + metric_tag(metric_)] = last_->test_metric;
  }
  try {
    tensorboard_->add_hparams(hparams, metrics);
  } catch (const UsageError& e) {  // an option TensorBoard cannot take: the run's figures stay
    std::cerr << "warning: no TensorBoard hparams for this run: " << e.what() << std::endl;
  }
  tensorboard_->close();
  tensorboard_.reset();
}

namespace detail {

void forget_open_run(const RunDir* run) {
  if (g_open_run == run) g_open_run = nullptr;
}

void note_ddp_step(const DistributedDataParallelBase& model) {
  if (g_open_run) g_open_run->note_ddp_stats(model.stats());
}

void write_epoch_records(RunDir& run, const EpochMetrics& m, int64_t step, double lr, const GradScaler* scaler) {
  SummaryWriter* tb = run.tensorboard();
  if (!tb) return;
  tb->add_scalar("epoch", static_cast<double>(m.epoch), step);
  tb->add_scalar("train/loss", m.train_loss, step);
  tb->add_scalar(metric_tag("test_loss"), m.test_loss, step);
  tb->add_scalar(metric_tag(run.metric_name()), m.test_metric, step);
  tb->add_scalar("train/samples_per_s", m.samples_per_s, step);
  tb->add_scalar("train/epoch_s", m.epoch_s, step);
  tb->add_scalar("train/lr", lr, step);
  if (scaler && scaler->is_enabled()) tb->add_scalar("amp/loss_scale", scaler->get_scale(), step);
  if (run.ddp_stats()) write_ddp_stats(*tb, *run.ddp_stats(), step);
  tb->flush();
}

void write_step_records(RunDir& run, int64_t step, double loss, double step_ms) {
  SummaryWriter* tb = run.tensorboard();
  if (!tb) return;
  tb->add_scalar("train/step_loss", loss, step);
  tb->add_scalar("train/step_ms", step_ms, step);
}

}  // namespace detail

}  // namespace ddp
