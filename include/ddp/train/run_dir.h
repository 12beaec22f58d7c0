// A run folder: what a run leaves behind, written by rank 0 only.
//
//   <run-dir>/log.txt         every line the run logged (environment, epochs, notices)
//   <run-dir>/metrics.csv     one row per epoch:
//                             epoch,train_loss,test_loss,test_acc,samples_per_s,epoch_s
//                             (a regression task names its own metric in place of test_acc)
//   <run-dir>/checkpoint/     the latest checkpoint (and the one before), every rank's
//                             part (ddp::save_sharded_checkpoint's folder);
//   <run-dir>/checkpoint.pt   or, when the ranks do not share the folder, one file by
//                             rank 0 (checkpoint.prev.pt: the one before)
//   <run-dir>/model.pt        the final model's state dict
//   <run-dir>/loss.png, <metric>.png, throughput.png, charts.gp
//                             charts drawn by gnuplot at the end (charts.gp redraws them)
//   <run-dir>/events.out.tfevents.*  TensorBoard's (--tensorboard, on by default;
//                             ddp/train/summary_writer.h): `tensorboard --logdir runs/`
//   <run-dir>/<time>/         the options as TensorBoard hparams, at the run's end
//
//   ddp::RunDir run(opts.run_dir(), *pg);
//   run.start(state.epoch);                 // after a resume, keeps the earlier epochs' rows
//   run.log("epoch 1: ...");
//   run.record({epoch, train_loss, test_loss, test_acc, samples_per_s, epoch_s});
//   run.draw_charts();
//
// No file of the folder is written through a symbolic link: a link where
// one of them goes is a CheckpointError naming it (see docs/reliability.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/reducer_stats.h"
#include "ddp/train/summary_writer.h"

namespace ddp {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based: the epoch just completed
  double train_loss = 0;
  double test_loss = 0;
  double test_metric = 0;  // accuracy, or the task's metric
  double samples_per_s = 0;
  double epoch_s = 0;
};

class RunDir {
 public:
  // Rank 0 creates the folder (CheckpointError-free: a std::runtime_error naming
  // the folder if it cannot). metric_name heads the metrics' fifth column.
  // Every rank prints one line saying where it runs ("rank 1 of 2 on node2,
  // pid 4242, gloo, run folder runs/x"), so a job's output shows the layout.
  RunDir(std::string path, const ProcessGroup& pg, std::string metric_name = "test_acc");
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const;
  std::string checkpoint_path() const { return file("checkpoint.pt"); }
  std::string model_path() const { return file("model.pt"); }

  // Starts metrics.csv afresh, keeping the rows of epochs <= completed_epochs
  // (those a resumed checkpoint already covers).
  void start(int64_t completed_epochs = 0);
  // Rank 0: prints `text` to stdout and appends it to log.txt. Others: nothing.
  void log(const std::string& text);
  // Rank 0: one row of metrics.csv, flushed at once.
  void record(const EpochMetrics& m);
  // Rank 0: PNG charts from metrics.csv with gnuplot. Returns false, with a
  // notice naming the package to install, if gnuplot is missing or fails.
  bool draw_charts();

  // Rank 0: opens the run's TensorBoard writer on the run folder itself
  // (resume_or_start does, with --tensorboard). Every record of an earlier
  // run of this folder at a step >= first_step is dropped by TensorBoard
  // (purge_step): a resumed run's steps replace a crashed run's. The lines
  // logged so far (the environment) become the text "environment"; the
  // options, the run's hyperparameters at its end (close_tensorboard).
  void open_tensorboard(int64_t first_step, std::map<std::string, std::string> options);
  // Rank 0 with --tensorboard: the writer (the kit's records go there, and a
  // program may add its own); nullptr otherwise.
  SummaryWriter* tensorboard() const { return tensorboard_.get(); }
  // The DDP model's statistics after a step (ddp::optimizer_step notes them),
  // written with the epoch's records.
  void note_ddp_stats(const ReducerStats& stats);
  const std::optional<ReducerStats>& ddp_stats() const { return ddp_stats_; }
  const std::string& metric_name() const { return metric_; }
  // Writes the hyperparameters with the last epoch's figures and closes the
  // writer (finish_run does).
  void close_tensorboard();
  // The group re-formed (ddp/comm/recovery.h): whoever is rank 0 now writes
  // the folder from now on, appending to log.txt and metrics.csv, and
  // TensorBoard records from step `step` on when they were asked for; a
  // rank that is no longer rank 0 stops. Nothing where rank 0 stayed.
  void follow(const ProcessGroup& pg, int64_t step);

 private:
  void open_folder(const ProcessGroup& pg);
  std::string path_, metric_;
  bool writer_;
  int log_fd_ = -1;  // log.txt, appended to
  std::unique_ptr<SummaryWriter> tensorboard_;
  std::map<std::string, std::string> options_;
  bool tensorboard_wanted_ = false;  // open_tensorboard was called (on every rank)
  std::string logged_;  // before the writer opens, up to 64 KiB
  std::optional<EpochMetrics> last_;
  std::optional<ReducerStats> ddp_stats_;
};

}  // namespace ddp
