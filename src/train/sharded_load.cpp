// Reading a sharded checkpoint (sharded_checkpoint.h): the manifest and the
// indexes checked, then each tensor a rank needs read from its data file
// straight into the tensor that keeps it (the model's own parameters and
// buffers on the CPU; a new optimizer state), its CRC-32 checked. Nothing
// else of the files is read: a rank's extra memory is the state it keeps.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "checkpoint_extra.h"
#include "checkpoint_io.h"
#include "comm/objects/object_exchange.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "module_archive.h"
#include "optim/zero_state.h"
#include "param_state_parts.h"
#include "runtime/unique_fd.h"
#include "sharded_checkpoint.h"
#include "state_dict_io.h"
#include "torch_pickle.h"
#include "zip_archive.h"

namespace ddp {
namespace detail {

namespace {

using pickle::Value;
using pickle::ValuePtr;

// Far beyond any real model; far below what would overflow.
constexpr int64_t kMaxTensors = int64_t(1) << 24, kMaxDims = 64;

struct TensorEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;
  uint32_t crc = 0;
  size_t shard = 0;  // whose data file
};

struct Sharded {
  std::string dir, manifest_path, id, kind;
  ValuePtr root;
  std::vector<std::string> data_files;                    // per shard
  std::unordered_map<std::string, TensorEntry> tensors;   // by name
  std::map<std::string, int64_t> steps;                   // "group/index" -> step
  std::map<std::string, std::vector<std::string>> fields;  // "group/index" -> its state's tensor fields
};

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw CheckpointError(what + ": " + why + "; a corrupt or crafted file?");
}

const Value& field(const ValuePtr& dict, const char* key, Value::Kind kind, const std::string& what) {
  auto v = dict && dict->is_dict() ? dict->get(key) : nullptr;
  if (!v || v->kind != kind) bad(what, std::string("entry \"") + key + "\" is missing or of another kind");
  return *v;
}

int64_t count(const ValuePtr& dict, const char* key, const std::string& what, int64_t high) {
  const int64_t v = field(dict, key, Value::Kind::Int, what).i;
  if (v < 0 || v > high) bad(what, std::string("entry \"") + key + "\" is " + std::to_string(v) + ", out of range");
  return v;
}

at::ScalarType dtype_named(const std::string& name, const std::string& what) {
  for (auto t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                 at::kByte, at::kBool})
    if (name == c10::toString(t)) return t;
  bad(what, "unknown dtype \"" + name.substr(0, 40) + "\"");
}

// A regular file's size, or why not.
std::string size_of(const std::string& path, uint64_t& size) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "cannot read " + path + " (" + std::strerror(errno) + ")";
  if (!S_ISREG(st.st_mode)) return path + " is not a regular file";
  size = static_cast<uint64_t>(st.st_size);
  return "";
}

void read_index(Sharded& s, size_t shard, const std::string& path, uint64_t bin_size, int64_t crc) {
  const auto bytes = pickle::read_file(path);
  if (zip::crc32_of(bytes.data(), bytes.size()) != static_cast<uint64_t>(crc))
    throw CheckpointError(path + " fails the CRC-32 check its manifest records: the file is damaged");
  const auto root = pickle::load(bytes, path);
  if (field(root, "format", Value::Kind::String, path).s != "libddp-checkpoint-shard") bad(path, "not a shard index");
  if (count(root, "data_bytes", path, std::numeric_limits<int64_t>::max()) != static_cast<int64_t>(bin_size))
    bad(path, "its data file is " + std::to_string(bin_size) + " bytes, not as long as the index says");
  const auto& list = field(root, "tensors", Value::Kind::List, path);
  if (static_cast<int64_t>(list.items.size()) > kMaxTensors) bad(path, "too many tensors");
  for (const auto& item : list.items) {
    TensorEntry e;
    e.shard = shard;
    e.name = field(item, "name", Value::Kind::String, path).s;
    e.dtype = dtype_named(field(item, "dtype", Value::Kind::String, path).s, path);
    const auto& shape = field(item, "shape", Value::Kind::List, path);
    if (static_cast<int64_t>(shape.items.size()) > kMaxDims) bad(path, e.name + ": too many dimensions");
    uint64_t numel = 1;
    for (const auto& d : shape.items) {
      if (d->kind != Value::Kind::Int || d->i < 0 || d->i > (int64_t(1) << 48)) bad(path, e.name + ": a bad size");
      e.shape.push_back(d->i);
      if (d->i && numel > (uint64_t(1) << 56) / static_cast<uint64_t>(d->i)) bad(path, e.name + ": too many elements");
      numel *= static_cast<uint64_t>(d->i);
    }
    e.offset = static_cast<uint64_t>(count(item, "offset", path, std::numeric_limits<int64_t>::max()));
    e.bytes = static_cast<uint64_t>(count(item, "bytes", path, std::numeric_limits<int64_t>::max()));
    e.crc = static_cast<uint32_t>(count(item, "crc32", path, 0xffffffffLL));
    if (e.bytes != numel * c10::elementSize(e.dtype)) bad(path, e.name + ": its size does not match its shape");
    if (e.offset > bin_size || e.bytes > bin_size - e.offset) bad(path, e.name + ": lies past its data file's end");
    if (!s.tensors.emplace(e.name, e).second) bad(path, e.name + " is written twice");
    if (e.name.rfind("optim/", 0) == 0) {
      const auto cut = e.name.rfind('/');
      if (cut <= 6) bad(path, e.name + ": a bad name");
      s.fields[e.name.substr(6, cut - 6)].push_back(e.name.substr(cut + 1));
    }
  }
  const auto& steps = field(root, "steps", Value::Kind::Dict, path);
  for (const auto& [k, v] : steps.dict) {
    if (k->kind != Value::Kind::String || v->kind != Value::Kind::Int) bad(path, "a bad optimizer step");
    s.steps[k->s] = v->i;
  }
}

// The manifest `name` in `dir` and every index it lists, checked.
Sharded read_sharded(const std::string& dir, const std::string& name, std::string* id = nullptr) {
  Sharded s;
  s.dir = dir;
  s.manifest_path = dir + "/" + name;
  const std::string& what = s.manifest_path;
  s.root = pickle::load(pickle::read_file(what), what);
  if (field(s.root, "format", Value::Kind::String, what).s != "libddp-sharded-checkpoint")
    bad(what, "not a sharded checkpoint's manifest");
  if (count(s.root, "version", what, 1) < 1) bad(what, "an unknown version");
  s.id = field(s.root, "id", Value::Kind::String, what).s;
  if (s.id.rfind("save-", 0) != 0 || s.id.find('/') != std::string::npos || s.id.size() > 64) bad(what, "a bad id");
  if (id) *id = s.id;
  s.kind = field(s.root, "optimizer_kind", Value::Kind::String, what).s;
  const auto& shards = field(s.root, "shards", Value::Kind::List, what);
  for (size_t r = 0; r < shards.items.size(); ++r) {
    const std::string index = dir + "/" + s.id + "/rank" + std::to_string(r) + ".pt";
    if (field(shards.items[r], "index", Value::Kind::String, what).s != s.id + "/rank" + std::to_string(r) + ".pt")
      bad(what, "shard " + std::to_string(r) + " is listed under another name");
    uint64_t size = 0, bin_size = 0;
    if (auto why = size_of(index, size); !why.empty()) throw CheckpointError(why);
    if (static_cast<int64_t>(size) != count(shards.items[r], "bytes", what, std::numeric_limits<int64_t>::max()))
      throw CheckpointError(index + " is " + std::to_string(size) + " bytes, not what " + what + " says");
    const std::string bin = dir + "/" + s.id + "/rank" + std::to_string(r) + ".bin";
    if (auto why = size_of(bin, bin_size); !why.empty()) throw CheckpointError(why);
    read_index(s, r, index, bin_size, count(shards.items[r], "crc32", what, 0xffffffffLL));
    s.data_files.push_back(bin);
  }
  if (static_cast<int64_t>(shards.items.size()) != count(s.root, "world_size", what, int64_t(1) << 20))
    bad(what, "as many shards as ranks are listed");
  return s;
}

// Reads entry `e` into `dst` (on the CPU, contiguous, of its dtype and
// size), checking its CRC-32.
void read_into(const Sharded& s, const TensorEntry& e, at::Tensor& dst, std::unordered_map<size_t, UniqueFd>& files) {
  const std::string& path = s.data_files[e.shard];
  auto& fd = files[e.shard];
  if (!fd) fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) throw CheckpointError("cannot read " + path + " (" + std::strerror(errno) + ")");
  char* to = static_cast<char*>(dst.data_ptr());
  for (uint64_t done = 0; done < e.bytes;) {
    const ssize_t got = ::pread(fd.get(), to + done, e.bytes - done, static_cast<off_t>(e.offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw CheckpointError(path + ": " + e.name + " could not be read whole (" +
                            (got < 0 ? std::strerror(errno) : "the file shrank") + ")");
    done += static_cast<uint64_t>(got);
  }
  if (zip::crc32_of(to, e.bytes) != e.crc)
    throw CheckpointError(path + ": " + e.name + " fails its CRC-32 check: the file is damaged");
}

// Entry `name` as a new CPU tensor, or an undefined one when there is none.
at::Tensor read_new(const Sharded& s, const std::string& name, std::unordered_map<size_t, UniqueFd>& files) {
  auto it = s.tensors.find(name);
  if (it == s.tensors.end()) return {};
  auto t = torch::empty(it->second.shape, torch::TensorOptions().dtype(it->second.dtype));
  read_into(s, it->second, t, files);
  return t;
}

void load_model_part(const Sharded& s, torch::nn::Module& model, std::unordered_map<size_t, UniqueFd>& files) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> missing, unexpected, shapes;
  const auto state = ddp::state_dict(model);
  for (const auto& item : state) {  // every name and shape checked before anything is read
    auto it = s.tensors.find("model/" + item.key());
    if (it == s.tensors.end()) missing.push_back(item.key());
    else if (item.value().sizes().vec() != it->second.shape)
      shapes.push_back(item.key() + " (file " + c10::str(it->second.shape) + ", model " + c10::str(item.value().sizes()) +
                       ")");
  }
  for (const auto& [name, e] : s.tensors)
    if (name.rfind("model/", 0) == 0 && !state.contains(name.substr(6))) unexpected.push_back(name.substr(6));
  if (!missing.empty() || !unexpected.empty() || !shapes.empty())
    throw CheckpointError(misfit_message(s.manifest_path + ": the checkpoint does not fit this model.", missing,
                                         unexpected, shapes));
  for (const auto& item : state) {
    const TensorEntry& e = s.tensors.at("model/" + item.key());
    at::Tensor dst = item.value();
    if (dst.device().is_cpu() && dst.is_contiguous() && dst.scalar_type() == e.dtype) {
      read_into(s, e, dst, files);  // straight into the parameter
    } else {
      auto staged = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
      read_into(s, e, staged, files);
      dst.copy_(staged);
    }
  }
}

using Files = std::unordered_map<size_t, UniqueFd>;

// `param`'s state (group g, index i) from the checkpoint into `target`, on
// `device`; nothing when the checkpoint holds none for it.
void fill_state(const Sharded& s, torch::optim::Optimizer& target, size_t g, size_t i, const at::Tensor& param,
                torch::Device device, Files& files) {
  const std::string where = std::to_string(g) + "/" + std::to_string(i);
  ParamStateParts parts;
  if (auto it = s.steps.find(where); it != s.steps.end()) parts.step = it->second;
  if (auto it = s.fields.find(where); it != s.fields.end())
    for (const auto& name : it->second) {
      auto t = read_new(s, "optim/" + where + "/" + name, files);
      if (t.sizes() != param.sizes())
        throw CheckpointError(s.manifest_path + ": the optimizer state of parameter " + where + " has shape " +
                              c10::str(t.sizes()) + ", the parameter " + c10::str(param.sizes()) +
                              "; was it written with another model?");
      parts.tensors.emplace_back(name, t.to(device));
    }
  if (!parts.step && parts.tensors.empty()) return;
  auto& states = target.state();
  states[zero_state::key_of(states, param)] = state_of_parts(s.kind, parts, s.manifest_path + ": parameter " + where);
}

// The optimizer's group options, then the state of each parameter this
// rank keeps: all of them, or under ZeRO its shard's and those it backs up.
void load_optimizer_part(const Sharded& s, torch::optim::Optimizer& optimizer, torch::Device device, int rank,
                         Files& files) {
  auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer);
  const std::string kind = optimizer_kind(zero ? zero->local_optimizer() : optimizer);
  if (kind != s.kind)
    throw CheckpointError(s.manifest_path + ": written with a " + s.kind + " optimizer; this one is " +
                          (kind.empty() ? "of another kind" : "a " + kind));
  const auto& groups = field(s.root, "optimizer_groups", Value::Kind::Tensor, s.manifest_path).tensor.contiguous();
  auto archive = module_archive::read(static_cast<const char*>(groups.data_ptr()), static_cast<size_t>(groups.numel()),
                                      s.manifest_path + ": its optimizer options", device);
  try {
    optimizer.load(archive);
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    throw CheckpointError(s.manifest_path + ": the optimizer does not fit these parameter groups (" +
                          msg.substr(0, msg.find('\n')) + "); was it written with another optimizer or model?");
  }
  const auto& all = optimizer.param_groups();
  if (!zero) {
    optimizer.state().clear();  // LibTorch's load keeps a state the archive has none for
    for (size_t g = 0; g < all.size(); ++g)
      for (size_t i = 0; i < all[g].params().size(); ++i) fill_state(s, optimizer, g, i, all[g].params()[i], device, files);
    return;
  }
  for (size_t g = 0; g < all.size(); ++g)
    for (size_t i : zero->partition().params[static_cast<size_t>(rank)][g])
      fill_state(s, zero->local_optimizer(), g, i, all[g].params()[i], device, files);
  if (auto* backup = zero->backup_optimizer()) {
    std::unordered_map<const void*, std::pair<size_t, size_t>> where;
    for (size_t g = 0; g < all.size(); ++g)
      for (size_t i = 0; i < all[g].params().size(); ++i) where[all[g].params()[i].unsafeGetTensorImpl()] = {g, i};
    for (const auto& group : backup->param_groups())
      for (const auto& p : group.params()) {
        const auto [g, i] = where.at(p.unsafeGetTensorImpl());
        fill_state(s, *backup, g, i, p, device, files);
      }
  }
}

// `manifest`'s save in `dir`, or nullopt and why not.
std::optional<Sharded> try_read(const std::string& dir, const std::string& manifest, std::string& why) {
  try {
    return read_sharded(dir, manifest);
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

constexpr const char* kEveryRankReads =
    ". A sharded checkpoint is read by every rank: its folder must be one they all see (a shared file system)";

// The save of the manifest `only`, which every rank must read whole.
Sharded the_save(const std::string& dir, const std::string& only, ProcessGroup& pg) {
  std::string why;
  std::optional<Sharded> s = try_read(dir, only, why);
  if (any_rank(pg, !s))
    throw CheckpointError(rank_tag(pg) + ": cannot resume from " + dir + "/" + only + ": " +
                          (why.empty() ? "another rank cannot read it (its log says why)" : why) + kEveryRankReads);
  return std::move(*s);
}

// The newest save every rank reads whole, else the one before it.
Sharded choose_save(const std::string& dir, ProcessGroup& pg) {
  std::string why, why_prev;
  std::optional<Sharded> s = try_read(dir, kManifest, why);
  if (!any_rank(pg, !s)) return std::move(*s);
  s = try_read(dir, "manifest.prev.pt", why_prev);
  if (any_rank(pg, !s))
    throw CheckpointError(rank_tag(pg) + ": cannot resume from " + dir + ": " +
                          (why.empty() && why_prev.empty() ? "another rank cannot read it (its log says why)"
                                                           : why + "\n  and the save before it: " + why_prev) +
                          kEveryRankReads);
  if (pg.rank() == 0)
    std::cout << "notice: " << dir << ": the newest save does not read whole on every rank ("
              << (why.empty() ? "another rank's log says why" : why) << "); resuming from the save before it"
              << std::endl;
  return std::move(*s);
}

}  // namespace

std::string why_not_whole_sharded(const std::string& dir, const std::string& manifest, std::string* id) {
  try {
    read_sharded(dir, manifest, id);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

TrainState load_sharded(
    const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer, ProcessGroup& pg,
    GradScaler* scaler,
    const std::function<void(const std::map<std::string, std::string>& config, const std::string& file)>& check_config) {
  // load_checkpoint found a sharded folder or one of its manifests there: the name tells which.
  const std::filesystem::path p(path);
  const bool one = p.filename() == kManifest || p.filename() == "manifest.prev.pt";
  const Sharded s = one ? the_save(p.parent_path().string(), p.filename().string(), pg) : choose_save(path, pg);
  const std::string& used = s.manifest_path;
  TrainState state = read_position(s.root, used);
  state.last_checkpoint = path;
  state.scaler = scaler;
  if (check_config) check_config(state.config, path);
  state.extra = extra_from_pickle(s.root->get("extra"), used);
  std::string error;
  try {
    Files files;
    load_model_part(s, model, files);
    torch::Device device = torch::kCPU;
    for (const auto& p : model.parameters()) {
      device = p.device();
      break;
    }
    if (optimizer) load_optimizer_part(s, *optimizer, device, pg.rank(), files);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (any_rank(pg, !error.empty()))
    throw CheckpointError(rank_tag(pg) + ": " +
                          (error.empty() ? "another rank could not load its part of " + path + "; its log says why"
                                         : error));
  if (scaler && scaler->is_enabled()) load_scaler(s.root, used, *scaler, pg);
  load_rng_state(s.root, used, state.world_size, pg);
  if (state.world_size != pg.size() && pg.rank() == 0)
    std::cout << "notice: " << path << " was written by " << state.world_size << " ranks; resuming with " << pg.size()
              << ": each rank read its part of the state from the shards (a ZeRO optimizer its new share); the data "
              << "position carries over exactly; random streams are reused round-robin." << std::endl;
  return state;
}

}  // namespace detail

void export_checkpoint(const std::string& dir, const std::string& file) {
  using namespace detail;
  Sharded s;
  try {
    s = read_sharded(dir, kManifest);
  } catch (const std::exception& first) {
    try {
      s = read_sharded(dir, "manifest.prev.pt");
      std::cout << "notice: " << first.what() << "\nnotice: exporting the save before it" << std::endl;
    } catch (const std::exception& second) {
      throw CheckpointError(std::string("cannot export ") + dir + ": " + first.what() + "\n  and the save before it: " +
                            second.what());
    }
  }
  CheckpointParts parts;
  parts.position = read_position(s.root, s.manifest_path);
  parts.position.extra = extra_from_pickle(s.root->get("extra"), s.manifest_path);
  parts.world_size = parts.position.world_size;
  parts.scaler = read_scaler(s.root, s.manifest_path);
  if (auto rng = s.root->get("rng_states"); rng && rng->kind == Value::Kind::List)
    for (const auto& t : rng->items)
      if (t->is_tensor()) parts.rng.push_back(t->tensor);
  Files files;
  for (const auto& key : field(s.root, "model_keys", Value::Kind::List, s.manifest_path).items) {
    if (key->kind != Value::Kind::String) bad(s.manifest_path, "a model key that is no str");
    auto t = read_new(s, "model/" + key->s, files);
    if (!t.defined()) bad(s.manifest_path, "model entry " + key->s + " is in no shard");
    parts.model.insert(key->s, t);
  }
  // The whole optimizer, over the model's own tensors where they are its
  // parameters (its archive keys each by position, not by tensor).
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& group : field(s.root, "params", Value::Kind::List, s.manifest_path).items) {
    if (group->kind != Value::Kind::List) bad(s.manifest_path, "entry \"params\" is not a list of lists");
    std::vector<at::Tensor> params;
    for (const auto& key : group->items) {
      const at::Tensor* t = key->kind == Value::Kind::String ? parts.model.find(key->s) : nullptr;
      params.push_back(t ? *t : torch::empty({0}));
    }
    groups.emplace_back(std::move(params));
  }
  auto optimizer = make_optimizer(s.kind, std::move(groups));
  load_optimizer_part(s, *optimizer, torch::kCPU, 0, files);
  std::ostringstream bytes;
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  archive.save_to(bytes);
  parts.optimizer = bytes.str();
  write_checkpoint_file(file, pickle_checkpoint(parts));
}

}  // namespace ddp
