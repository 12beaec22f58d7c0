// Writing a sharded checkpoint: who owns what, this rank's part staged and
// written, rank 0's manifest and the removal of older saves
// (sharded_checkpoint.h; loading is sharded_load.cpp).
#include "sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <algorithm>
#include <unordered_map>

#include "checkpoint_extra.h"
#include "checkpoint_io.h"
#include "comm/objects/object_exchange.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "optim/zero_state.h"
#include "param_state_parts.h"
#include "runtime/atomic_file.h"
#include "runtime/unique_fd.h"
#include "zip_archive.h"

namespace ddp::detail {

namespace {

constexpr const char* kManifestFormat = "libddp-sharded-checkpoint";
constexpr int64_t kAlignment = 64;

std::string random_id() {
  std::random_device device;
  std::ostringstream id;
  id << "save-" << std::hex << ((static_cast<uint64_t>(device()) << 32) | device());
  return id.str();
}

// The optimizer's group options as LibTorch's archive, with no state: a
// fresh optimizer of the same kind over the same groups, saved.
at::Tensor groups_archive(const OptimizerLayout& layout) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : *layout.groups) groups.emplace_back(g.params(), g.options().clone());
  torch::serialize::OutputArchive archive;
  make_optimizer(layout.kind, std::move(groups))->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string bytes = out.str();
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Rank 0's manifest, all but its list of shards.
c10::impl::GenericDict manifest_of(const TrainState& state, const ProcessGroup& pg, std::vector<at::Tensor> rng,
                                   const OptimizerLayout& layout, const std::vector<std::string>& model_keys,
                                   const std::string& id) {
  CheckpointParts parts;
  parts.position = state;
  parts.scaler = state.scaler ? state.scaler->state_dict() : std::nullopt;
  parts.world_size = pg.size();
  parts.rng = std::move(rng);
  auto d = common_entries(parts, kManifestFormat);
  d.insert("id", id);
  d.insert("optimizer_kind", layout.kind);
  d.insert("optimizer_groups", groups_archive(layout));
  c10::List<std::string> keys;
  for (const auto& k : model_keys) keys.push_back(k);
  d.insert("model_keys", keys);
  c10::List<c10::List<std::string>> params;
  for (const auto& group : layout.param_keys) params.push_back(c10::List<std::string>(group));
  d.insert("params", params);
  return d;
}

// A folder made if missing; CheckpointError if a link or a file is in its place.
void make_folder(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  const int err = errno;
  struct stat st {};
  if (err == EEXIST && ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  throw CheckpointError("cannot make the checkpoint folder " + path + " (" +
                        (err == EEXIST ? std::string("a file or symbolic link is in the way") : std::strerror(err)) +
                        ")");
}

// The tensors of one rank into `path`, each at a 64-byte boundary; their
// index entries.
c10::impl::GenericList write_tensors(const std::string& path, const ShardedSave& save, uint64_t& size) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  auto fail = [&](const char* step, int err) {
    ::unlink(path.c_str());
    throw CheckpointError("writing " + path + ": " + step + " failed (" + std::strerror(err) +
                          "); the checkpoint before this one is untouched. Check free space and permissions");
  };
  if (!fd) fail("open", errno);
  c10::impl::GenericList entries(c10::AnyType::get());
  static const char zeros[kAlignment] = {};
  uint64_t offset = 0;
  for (const auto& [name, tensor] : save.tensors) {
    const at::Tensor t = tensor.contiguous();
    const uint64_t pad = (kAlignment - offset % kAlignment) % kAlignment;
    if (pad && write_all(fd.get(), zeros, pad) != 0) fail("write", errno);
    offset += pad;
    const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
    const char* p = static_cast<const char*>(t.data_ptr());
    if (n && write_all(fd.get(), p, n) != 0) fail("write", errno);
    c10::impl::GenericDict e(c10::StringType::get(), c10::AnyType::get());
    e.insert("name", name);
    e.insert("dtype", std::string(c10::toString(t.scalar_type())));
    e.insert("shape", c10::List<int64_t>(t.sizes().vec()));
    e.insert("offset", static_cast<int64_t>(offset));
    e.insert("bytes", static_cast<int64_t>(n));
    e.insert("crc32", static_cast<int64_t>(zip::crc32_of(p, n)));
    entries.push_back(e);
    offset += n;
  }
  if (::fsync(fd.get()) != 0) fail("fsync", errno);
  if (const int err = fd.close_checked()) fail("close", err);
  size = offset;
  return entries;
}

// "save-<id>" folders in `dir` that neither manifest names.
void remove_stale_saves(const std::string& dir, const std::string& keep, const std::string& keep_too) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("save-", 0) != 0 || name == keep || name == keep_too) continue;
    if (entry.is_directory(ec) && !entry.is_symlink(ec)) std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

OptimizerLayout layout_of(const torch::optim::Optimizer& optimizer, const StateDict& model_state, int world) {
  OptimizerLayout layout;
  const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer);
  layout.groups = &optimizer.param_groups();
  layout.state_holder = zero ? &zero->local_optimizer() : &optimizer;
  layout.kind = optimizer_kind(*layout.state_holder);
  std::unordered_map<const void*, std::string> key_of_impl;
  for (const auto& item : model_state) key_of_impl.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::vector<std::vector<int64_t>> numels;
  for (const auto& g : *layout.groups) {
    numels.emplace_back();
    layout.param_keys.emplace_back();
    for (const auto& p : g.params()) {
      numels.back().push_back(p.numel());
      auto it = key_of_impl.find(p.unsafeGetTensorImpl());
      layout.param_keys.back().push_back(it == key_of_impl.end() ? std::string() : it->second);
    }
  }
  layout.owner = zero ? zero->partition().owner : partition_parameters(numels, world).owner;
  return layout;
}

std::vector<int> model_owners(const StateDict& model_state, const OptimizerLayout& layout, int world) {
  std::unordered_map<std::string, int> param_owner;
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (size_t g = 0; g < layout.param_keys.size(); ++g)
    for (size_t i = 0; i < layout.param_keys[g].size(); ++i)
      if (!layout.param_keys[g][i].empty()) param_owner.emplace(layout.param_keys[g][i], layout.owner[g][i]);
  for (const auto& item : model_state)
    if (auto it = param_owner.find(item.key()); it != param_owner.end()) load[static_cast<size_t>(it->second)] += item.value().numel();
  std::vector<int> owners;
  for (const auto& item : model_state) {
    auto it = param_owner.find(item.key());
    const int r = it != param_owner.end()
                      ? it->second
                      : static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    if (it == param_owner.end()) load[static_cast<size_t>(r)] += item.value().numel();
    owners.push_back(r);
  }
  return owners;
}

ShardedSave stage_sharded(const std::string& dir, const torch::nn::Module& model,
                          const torch::optim::Optimizer& optimizer, const TrainState& state, ProcessGroup& pg,
                          const std::function<at::Tensor(const at::Tensor&)>& copy) {
  const auto model_state = ddp::state_dict(model);
  const OptimizerLayout layout = layout_of(optimizer, model_state, pg.size());
  if (layout.kind.empty())
    throw UsageError(rank_tag(pg) + ": a sharded checkpoint writes the state of SGD, Adam, AdamW, Adagrad and "
                     "RMSprop; this optimizer is another: write it to one file (save_checkpoint)");
  ShardedSave save;
  save.dir = dir;
  save.rank = pg.rank();
  save.world = pg.size();
  save.id = broadcast_bytes(pg, pg.rank() == 0 ? random_id() : std::string(), 0);
  auto rng = pg.allgather(cpu_rng_state().to(pg.device()));
  torch::NoGradGuard no_grad;
  const auto owners = model_owners(model_state, layout, pg.size());
  std::vector<std::string> model_keys;
  for (size_t k = 0; k < model_state.size(); ++k) {
    model_keys.push_back(model_state[k].key());
    if (owners[k] == save.rank) save.tensors.emplace_back("model/" + model_state[k].key(), copy(model_state[k].value()));
  }
  const auto& states = layout.state_holder->state();
  for (size_t g = 0; g < layout.groups->size(); ++g) {
    const auto& params = (*layout.groups)[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (layout.owner[g][i] != save.rank) continue;
      auto it = states.find(zero_state::key_of(states, params[i]));
      if (it == states.end()) continue;
      const auto parts = parts_of_state(*it->second);
      const std::string where = std::to_string(g) + "/" + std::to_string(i);
      if (parts->step) save.steps[where] = *parts->step;
      for (const auto& [field, t] : parts->tensors) save.tensors.emplace_back("optim/" + where + "/" + field, copy(t));
    }
  }
  if (save.rank == 0) save.manifest = manifest_of(state, pg, std::move(rng), layout, model_keys, save.id);
  return save;
}

std::string write_shard(const ShardedSave& save) {
  try {
    const std::string folder = save.dir + "/" + save.id, name = "rank" + std::to_string(save.rank);
    make_folder(save.dir);
    make_folder(folder);
    uint64_t size = 0;
    auto entries = write_tensors(folder + "/" + name + ".bin", save, size);
    c10::impl::GenericDict index(c10::StringType::get(), c10::AnyType::get());
    index.insert("format", std::string("libddp-checkpoint-shard"));
    index.insert("rank", static_cast<int64_t>(save.rank));
    index.insert("data", name + ".bin");
    index.insert("data_bytes", static_cast<int64_t>(size));
    index.insert("tensors", entries);
    c10::Dict<std::string, int64_t> steps;
    for (const auto& [where, step] : save.steps) steps.insert(where, step);
    index.insert("steps", steps);
    const auto bytes = torch::pickle_save(index);
    write_atomically(folder + "/" + name + ".pt", bytes);  // syncs the folder: the .bin's entry too
    return "ok " + std::to_string(bytes.size()) + " " + std::to_string(zip::crc32_of(bytes.data(), bytes.size()));
  } catch (const std::exception& e) {
    return std::string("error: ") + e.what();
  }
}

void write_manifest(const ShardedSave& save, const std::vector<std::string>& statuses) {
  c10::impl::GenericList shards(c10::AnyType::get());
  for (size_t r = 0; r < statuses.size(); ++r) {
    std::istringstream in(statuses[r]);
    std::string word;
    int64_t bytes = -1, crc = -1;
    in >> word >> bytes >> crc;
    if (word != "ok" || bytes < 0 || crc < 0) {
      // Every part is in (or failed): what this save wrote goes, freeing the room it took.
      std::error_code ec;
      std::filesystem::remove_all(save.dir + "/" + save.id, ec);
      throw CheckpointError("rank " + std::to_string(r) + " could not write its part of the checkpoint " + save.dir +
                            ": " + (statuses[r].rfind("error: ", 0) == 0 ? statuses[r].substr(7) : statuses[r]) +
                            "; the checkpoint before this one stands");
    }
    c10::impl::GenericDict shard(c10::StringType::get(), c10::AnyType::get());
    shard.insert("index", save.id + "/rank" + std::to_string(r) + ".pt");
    shard.insert("bytes", bytes);
    shard.insert("crc32", crc);
    shards.push_back(shard);
  }
  auto manifest = save.manifest.copy();
  manifest.insert("shards", shards);
  const std::string path = save.dir + "/" + kManifest, prev = save.dir + "/manifest.prev.pt";
  write_temporary(path, torch::pickle_save(manifest));
  // The manifest it replaces becomes the previous one if it is whole (a hard
  // link, so that `path` never disappears); a damaged one never replaces it.
  std::string kept_id;
  if (std::filesystem::exists(path)) {
    std::string id;
    if (why_not_whole_sharded(save.dir, kManifest, &id).empty()) {
      ::unlink((prev + ".tmp").c_str());
      if (::link(path.c_str(), (prev + ".tmp").c_str()) == 0 && ::rename((prev + ".tmp").c_str(), prev.c_str()) == 0)
        kept_id = id;
    }
  }
  replace_with_temporary(path);
  if (kept_id.empty()) why_not_whole_sharded(save.dir, "manifest.prev.pt", &kept_id);
  remove_stale_saves(save.dir, save.id, kept_id);
}

bool is_sharded_manifest(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename() != kManifest && p.filename() != "manifest.prev.pt") return false;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return false;
  for (std::filesystem::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("save-", 0) == 0 && it->is_directory(ec)) return true;
  return false;
}

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         (std::filesystem::exists(path + "/" + kManifest, ec) || std::filesystem::exists(path + "/manifest.prev.pt", ec));
}

}  // namespace ddp::detail
