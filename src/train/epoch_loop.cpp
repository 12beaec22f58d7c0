#include "ddp/train/epoch_loop.h"

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

}  // namespace ddp
