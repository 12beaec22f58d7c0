// Sharded checkpoints (a folder): every rank writes the part it owns, in
// parallel, and rank 0 a small manifest last, which makes the save visible;
// loading reads each rank's part straight from the files into its tensors,
// at any world size. What save_sharded_checkpoint, the CheckpointWriter and
// load_checkpoint share. Private.
//
// The folder:
//   manifest.pt        the newest save: a pickled dict (torch.load reads it)
//                      with where the run is, the config, the extras, every
//                      rank's generator, the optimizer's kind and group
//                      options, the model key of each optimizer parameter,
//                      and the list of the save's shard files with their
//                      size and CRC-32;
//   manifest.prev.pt   the save before it;
//   save-<id>/rank<r>.bin   rank r's tensors, raw, each at a 64-byte boundary;
//   save-<id>/rank<r>.pt    their index: name, dtype, shape, offset, size and
//                      CRC-32 of each; the optimizer steps.
// Tensor names: "model/<key>" and "optim/<group>/<index>/<field>" (Adam's
// "exp_avg", ...). Each optimizer parameter is owned by one rank (under ZeRO
// its shard's, else ZeRO's partition rule over the parameters' sizes), which
// writes it and its state; buffers go to the least loaded rank. A save's
// folder is written whole and synced before the manifest names it; folders
// that neither manifest names are removed after the new manifest is in.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"

namespace ddp::detail {

constexpr const char* kManifest = "manifest.pt";

// Who writes what, the same on every rank.
struct OptimizerLayout {
  const std::vector<torch::optim::OptimizerParamGroup>* groups = nullptr;  // every parameter (ZeRO: its own groups)
  const torch::optim::Optimizer* state_holder = nullptr;  // whose state() is this rank's (ZeRO: the local optimizer)
  std::string kind;                                       // param_state_parts.h; "" for another optimizer
  std::vector<std::vector<int>> owner;                    // [group][index]: the rank that writes it
  std::vector<std::vector<std::string>> param_keys;       // [group][index]: its model key, "" if none
};
OptimizerLayout layout_of(const torch::optim::Optimizer& optimizer, const StateDict& model_state, int world);
// The rank that writes each model entry: a parameter's owner; any other
// entry the least loaded rank then, in order.
std::vector<int> model_owners(const StateDict& model_state, const OptimizerLayout& layout, int world);

// One save, staged on the training thread.
struct ShardedSave {
  std::string dir, id;
  int rank = 0, world = 1;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // this rank's, on the CPU
  std::map<std::string, int64_t> steps;                      // "group/index" -> its optimizer step
  c10::impl::GenericDict manifest{c10::StringType::get(), c10::AnyType::get()};  // rank 0: all but "shards"
};

// Collective (the save's id and every rank's generator travel). Stages this
// rank's part with `copy` (a host copy for a background write, or the tensor
// itself). UsageError on every rank for an optimizer whose state it cannot
// take apart (another than SGD, Adam, AdamW, Adagrad, RMSprop).
ShardedSave stage_sharded(const std::string& dir, const torch::nn::Module& model,
                          const torch::optim::Optimizer& optimizer, const TrainState& state, ProcessGroup& pg,
                          const std::function<at::Tensor(const at::Tensor&)>& copy);

// Writes this rank's files. Returns its status for the manifest: "ok BYTES
// CRC32" (of its index file), or "error: why".
std::string write_shard(const ShardedSave& save);

// Rank 0, once every rank's status is in: the manifest over the save's
// files, the previous one kept, older saves removed. CheckpointError naming
// the rank whose part failed, or the step that did.
void write_manifest(const ShardedSave& save, const std::vector<std::string>& statuses);

// "" when dir/manifest (manifest.pt or manifest.prev.pt) and every index it
// lists are whole (sizes and CRC-32s as written, each data file as long as
// its index says), else why not; *id is the save's id when the manifest
// itself reads.
std::string why_not_whole_sharded(const std::string& dir, const std::string& manifest, std::string* id);

// Whether `path` is a sharded checkpoint's folder (it holds a manifest).
bool is_sharded_checkpoint(const std::string& path);
// Whether `path` is one of the manifests (manifest.pt, manifest.prev.pt) of
// a sharded checkpoint's folder (one with a save-* folder beside them): to
// load that save alone, as one names checkpoint.prev.pt.
bool is_sharded_manifest(const std::string& path);

// Collective: load_checkpoint for a folder (its newest save that every rank
// reads whole, else the one before it) or for one of its manifests (that
// save only).
TrainState load_sharded(
    const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer, ProcessGroup& pg,
    GradScaler* scaler,
    const std::function<void(const std::map<std::string, std::string>& config, const std::string& file)>& check_config);

}  // namespace ddp::detail
