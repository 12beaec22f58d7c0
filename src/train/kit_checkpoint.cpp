#include "train/kit_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <optional>
#include <random>

#include "comm/objects/object_exchange.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "runtime/unique_fd.h"
#include "train/param_state_parts.h"
#include "train/sharded_checkpoint.h"

namespace ddp::detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFolder = "checkpoint";

// When the first of `names` (the newest first) that `dir` holds was written;
// nullopt if it holds none.
std::optional<fs::file_time_type> written(const fs::path& dir, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    std::error_code ec;
    const auto t = fs::last_write_time(dir / name, ec);
    if (!ec) return t;
  }
  return std::nullopt;
}

// Collective: whether every rank sees `dir` as rank 0's.
bool every_rank_sees(const std::string& dir, ProcessGroup& pg) {
  if (pg.size() == 1) return true;
  std::string name;
  if (pg.rank() == 0) {
    std::random_device random;
    name = ".every-rank-sees-" + std::to_string(random()) + std::to_string(random());
    UniqueFd fd(::open((fs::path(dir) / name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd) name.clear();
  }
  name = broadcast_bytes(pg, name, 0);
  std::error_code ec;
  const bool seen = !name.empty() && fs::exists(fs::path(dir) / name, ec);
  const bool all = !any_rank(pg, !seen);
  if (pg.rank() == 0 && !name.empty()) fs::remove(fs::path(dir) / name, ec);
  return all;
}

}  // namespace

CheckpointLayout kit_layout(RunDir& run, const torch::optim::Optimizer& optimizer, ProcessGroup& pg) {
  const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer);
  if (optimizer_kind(zero ? zero->local_optimizer() : optimizer).empty()) {
    run.log("checkpoints: " + run.checkpoint_path() +
            ", one file by rank 0 (a sharded checkpoint takes apart SGD, Adam, AdamW, Adagrad and RMSprop only)");
    return CheckpointLayout::single_file;
  }
  if (!every_rank_sees(run.path(), pg)) {
    run.log("checkpoints: " + run.checkpoint_path() + ", one file by rank 0: not every rank sees the run folder " +
            run.path() + " as rank 0's (a folder of each node's own, not a shared file system)");
    return CheckpointLayout::single_file;
  }
  run.log("checkpoints: " + run.file(kFolder) + ", every rank writing its part (sharded, in the background)");
  return CheckpointLayout::sharded;
}

std::string kit_checkpoint_path(const RunDir& run, const TrainState& state) {
  return state.writer && state.writer->layout() == CheckpointLayout::sharded ? run.file(kFolder)
                                                                               : run.checkpoint_path();
}

std::string newest_checkpoint(const std::string& folder) {
  const fs::path dir(folder);
  const auto file = written(dir, {"checkpoint.pt", "checkpoint.prev.pt"});
  const auto sharded = written(dir / kFolder, {kManifest, "manifest.prev.pt"});
  if (sharded && (!file || *sharded >= *file)) return (dir / kFolder).string();
  if (file) return (dir / "checkpoint.pt").string();
  return "";
}

}  // namespace ddp::detail
