#include "ddp/train/epoch_loop.h"

#include "atomic_file.h"

#include <cstdio>

#include "ddp/object_collectives.h"

namespace ddp {

void end_epoch(int64_t epoch, const TrainEpoch& train, double test_loss, double test_metric, const std::string& line,
               const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, const TrainOptions& opts,
               TrainState& state, RunDir& run, ProcessGroup& pg) {
  state.epoch = epoch + 1;
  state.sampler_epoch = epoch + 1;
  run.record({state.epoch, train.loss, test_loss, test_metric, train.samples_per_s(), train.seconds});
  run.log("epoch " + std::to_string(state.epoch) + ": " + line);
  if (opts.checkpoint_due(state.epoch)) save_checkpoint(run.checkpoint_path(), model, optimizer, state, pg);
}

std::string classifier_epoch_line(const TrainEpoch& train, const ClassifierResult& eval) {
  char line[160];
  std::snprintf(line, sizeof line, "train loss %.4f, test loss %.4f, test acc %.4f (%lld samples), %.1f s", train.loss,
                eval.loss(), eval.accuracy(), static_cast<long long>(eval.count), train.seconds);
  return line;
}

void save_ddp_logging_data(RunDir& run, const DistributedDataParallelBase& model, ProcessGroup& pg) {
  const auto parts = all_gather_object(pg, model.get_ddp_logging_data().to_json());
  if (pg.rank() != 0) return;
  std::string text = "[\n";
  for (size_t r = 0; r < parts.size(); ++r) text += (r ? ",\n" : "") + parts[r];
  text += "]\n";
  const std::string path = run.file("ddp_logging.json");
  write_atomically(path, std::vector<char>(text.begin(), text.end()));
  run.log("DDP logging data: " + path);
}

void finish_run(RunDir& run, const torch::nn::Module& model, const ProcessGroup& pg, const std::string& summary) {
  if (pg.rank() == 0) save_state_dict(model, run.model_path());
  if (!summary.empty()) run.log(summary);
  run.draw_charts();
}

}  // namespace ddp
