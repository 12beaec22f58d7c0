#include "ddp/train/checkpoint.h"

#include "runtime/atomic_file.h"
#include "checkpoint_extra.h"
#include "checkpoint_io.h"
#include "live_state.h"
#include "comm/objects/object_exchange.h"
#include "ddp/train/preemption.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/train_options.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "module_archive.h"
#include "sharded_checkpoint.h"
#include "runtime/parse_number.h"
#include "state_dict_io.h"
#include "zip_archive.h"

#include <sys/stat.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace ddp {

namespace detail {

torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void share_verdict(ProcessGroup& pg, bool ok, const std::string& what) {
  const bool rank0_ok = detail::broadcast_flag(pg, ok, 0);
  if (pg.rank() != 0 && !rank0_ok)
    throw CheckpointError(rank_tag(pg) + ": rank 0 failed " + what + "; its log says why");
}

}  // namespace detail

using detail::cpu_rng_state;
using detail::load_rng_state;
using detail::load_scaler;
using detail::read_position;
using detail::share_verdict;

namespace {

constexpr const char* kFormat = "libddp-checkpoint";
constexpr int64_t kVersion = 1;

torch::Tensor bytes_tensor(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  if (!s.empty()) std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

std::string tensor_bytes(const torch::Tensor& t) {
  auto c = t.contiguous().cpu();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
}


void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}


int64_t get_int(const pickle::ValuePtr& root, const char* key, const std::string& path) {
  auto v = root->get(key);
  if (!v || v->kind != pickle::Value::Kind::Int)
    throw CheckpointError(path + ": checkpoint entry \"" + key + "\" missing or not an integer; corrupt file?");
  return v->i;
}

// get_int, within [low, high]: a count a run could have reached.
int64_t get_count(const pickle::ValuePtr& root, const char* key, const std::string& path, int64_t low, int64_t high) {
  const int64_t v = get_int(root, key, path);
  if (v < low || v > high)
    throw CheckpointError(path + ": checkpoint entry \"" + key + "\" is " + std::to_string(v) + ", outside [" +
                          std::to_string(low) + ", " + std::to_string(high) + "]; a corrupt or crafted file?");
  return v;
}

// Bounds on what a checkpoint may say: far beyond any real run, far below
// what would overflow the loops and seeds they feed.
constexpr int64_t kMaxEpochs = int64_t(1) << 31, kMaxSteps = int64_t(1) << 53, kMaxWorldSize = int64_t(1) << 20;

// A mid-epoch checkpoint of an older version holds only "epoch_step",
// batches per rank. Its samples taken are epoch_step * batch * world_size,
// with the batch and world of the run that wrote it: exact, because such a
// file was only ever resumed at the same settings (and the batches before a
// checkpoint are all whole).
int64_t old_epoch_samples(const TrainState& state, const std::string& path) {
  auto number = [&](const char* key) -> int64_t {
    auto it = state.config.find(key);
    const auto v = it == state.config.end() ? std::nullopt : parse_integer(it->second, 0, kMaxSteps);
    return v ? *v : -1;
  };
  const int64_t per_process = number("batch_size"), global = number("global_batch_size");
  const int64_t batch = per_process > 0 ? per_process : global > 0 ? global / state.world_size : 0;
  const long double samples = static_cast<long double>(state.epoch_step) * batch * state.world_size;
  if (batch <= 0 || samples > static_cast<long double>(kMaxSteps))
    throw CheckpointError(path + ": checkpoint entry \"epoch_step\" is " + std::to_string(state.epoch_step) +
                          " but its \"config\" gives no batch size to count the samples taken with; a corrupt or "
                          "crafted file?");
  return static_cast<int64_t>(samples);
}

// ---- which checkpoint files are known to be whole --------------------------
//
// A file this process wrote (and read back) or read and verified, by its
// identity on disk; anything else is verified before it may become the
// previous checkpoint.
using FileId = std::tuple<dev_t, ino_t, off_t, int64_t, int64_t>;

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
}

std::mutex known_mutex;
std::map<std::string, FileId> known_good;

void remember_good(const std::string& path) {
  std::lock_guard<std::mutex> lock(known_mutex);
  if (auto id = file_id(path)) known_good[path] = *id;
}

double get_number(const pickle::ValuePtr& dict, const char* key, const std::string& path) {
  auto v = dict->get(key);
  if (v && v->kind == pickle::Value::Kind::Float) return v->f;
  if (v && v->kind == pickle::Value::Kind::Int) return static_cast<double>(v->i);
  throw CheckpointError(path + ": checkpoint entry \"scaler\" has no number \"" + key + "\"; corrupt file?");
}


// "an int", "a list": what a crafted value is, for errors.
std::string kind_text(const pickle::Value& v) {
  using Kind = pickle::Value::Kind;
  switch (v.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "a bool";
    case Kind::Int: return "an int";
    case Kind::Float: return "a float";
    case Kind::String: return "a str";
    case Kind::Tuple: return "a tuple";
    case Kind::List: return "a list";
    case Kind::Dict: return "a dict";
    case Kind::Tensor: return "a tensor";
    case Kind::Global: return "a Python name";
    case Kind::Object: return "a Python object";
  }
  return "a value of an unknown kind";
}

// The "config" entry: each option's name to its text, as save_checkpoint
// writes it (none in older checkpoints). It feeds the must_match checks on
// resume: a key or value that is not a str is refused, never read as "".
std::map<std::string, std::string> read_config(const pickle::ValuePtr& root, const std::string& path) {
  using Kind = pickle::Value::Kind;
  std::map<std::string, std::string> config;
  const auto entry = root->get("config");
  if (!entry) return config;
  const std::string bad = "; a corrupt or crafted file?";
  if (!entry->is_dict())
    throw CheckpointError(path + ": checkpoint entry \"config\" is " + kind_text(*entry) + ", not a dict of str" + bad);
  for (const auto& [k, v] : entry->dict) {
    if (k->kind != Kind::String)
      throw CheckpointError(path + ": checkpoint entry \"config\" has a key that is " + kind_text(*k) + ", not a str" +
                            (k->kind == Kind::Int ? " (" + std::to_string(k->i) + ")" : std::string()) + bad);
    const std::string key = k->s.size() <= 40 ? k->s : k->s.substr(0, 40) + "...";
    if (v->kind != Kind::String)
      throw CheckpointError(path + ": checkpoint entry \"config\"[\"" + key + "\"] is " + kind_text(*v) + ", not a str" +
                            bad);
    config[k->s] = v->s;
  }
  return config;
}

}  // namespace

namespace detail {

std::optional<GradScalerState> read_scaler(const pickle::ValuePtr& root, const std::string& path) {
  auto entry = root->get("scaler");
  if (!entry) return std::nullopt;
  if (!entry->is_dict()) throw CheckpointError(path + ": checkpoint entry \"scaler\" is not a dict; corrupt file?");
  GradScalerState s;
  s.scale = get_number(entry, "scale", path);
  s.growth_factor = get_number(entry, "growth_factor", path);
  s.backoff_factor = get_number(entry, "backoff_factor", path);
  s.growth_interval = get_int(entry, "growth_interval", path);
  s.growth_tracker = get_int(entry, "_growth_tracker", path);
  return s;
}

void load_scaler(const pickle::ValuePtr& root, const std::string& path, GradScaler& scaler, const ProcessGroup& pg) {
  const auto s = read_scaler(root, path);
  if (!s) {
    if (pg.rank() == 0)
      std::cout << "notice: " << path << " has no loss-scaler state (written without float16 mixed precision); "
                << "the scaler starts at its initial scale " << scaler.get_scale() << std::endl;
    return;
  }
  try {
    scaler.load_state_dict(*s);
  } catch (const UsageError& e) {
    throw CheckpointError(rank_tag(pg) + ": " + path + ": checkpoint entry \"scaler\": " + e.what());
  }
}

TrainState read_position(const pickle::ValuePtr& root, const std::string& used) {
  TrainState state;
  state.last_checkpoint = used;
  state.epoch = get_count(root, "epoch", used, 0, kMaxEpochs);
  state.step = get_count(root, "step", used, 0, kMaxSteps);
  state.sampler_epoch = get_count(root, "sampler_epoch", used, 0, kMaxEpochs);
  // Absent from checkpoints written at an epoch's end by older versions.
  state.epoch_step = root->get("epoch_step") ? get_count(root, "epoch_step", used, 0, kMaxSteps) : 0;
  state.world_size = static_cast<int>(get_count(root, "world_size", used, 1, kMaxWorldSize));
  if (root->get("epoch_samples")) state.epoch_samples = get_count(root, "epoch_samples", used, 0, kMaxSteps);
  state.config = read_config(root, used);
  return state;
}

void load_rng_state(const pickle::ValuePtr& root, const std::string& used, int world_size, const ProcessGroup& pg) {
  auto rng = root->get("rng_states");
  if (!rng || rng->kind != pickle::Value::Kind::List || rng->items.empty()) return;
  if (rng->items.size() != static_cast<size_t>(world_size))
    throw CheckpointError(rank_tag(pg) + ": " + used + ": checkpoint entry \"rng_states\" holds " +
                          std::to_string(rng->items.size()) + " generator states for a world of " +
                          std::to_string(world_size) + "; a corrupt or crafted file?");
  const auto& mine = rng->items[static_cast<size_t>(pg.rank()) % rng->items.size()];
  if (!mine->is_tensor()) return;
  try {
    set_cpu_rng_state(mine->tensor.contiguous());
  } catch (const std::exception& e) {
    std::string msg = e.what();
    throw CheckpointError(rank_tag(pg) + ": " + used + ": checkpoint entry \"rng_states\" is not a CPU generator "
                          "state (" + msg.substr(0, msg.find('\n')) + "); corrupt file?");
  }
}

}  // namespace detail

namespace {

// Parses and checks a checkpoint; throws CheckpointError saying what is wrong.
pickle::ValuePtr parse_checkpoint(const std::vector<char>& bytes, const std::string& path) {
  auto root = pickle::load(bytes, path);
  auto format = root->is_dict() ? root->get("format") : nullptr;
  if (!format || format->s != kFormat) {
    std::string keys;
    if (root->is_dict())
      for (auto& [k, v] : root->dict)
        if (k->kind == pickle::Value::Kind::String && keys.size() < 200) keys += (keys.empty() ? "" : ", ") + k->s;
    throw CheckpointError(path + ": a PyTorch file but not a libddp checkpoint" +
                          (keys.empty() ? std::string() : " (keys: " + keys + ")") +
                          ". To start from its weights, use ddp::read_state_dict() and ddp::load_state_dict().");
  }
  if (get_int(root, "version", path) > kVersion)
    throw CheckpointError(path + ": checkpoint version " + std::to_string(get_int(root, "version", path)) +
                          " is newer than this libddp understands (" + std::to_string(kVersion) + "); upgrade libddp");
  return root;
}

// "" when `path` holds a whole checkpoint, else why not.
std::string why_not_whole(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(known_mutex);
    auto it = known_good.find(path);
    if (it != known_good.end() && file_id(path) == it->second) return "";
  }
  try {
    parse_checkpoint(pickle::read_file(path), path);  // every entry's CRC-32 too
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Writes `bytes` as the checkpoint `path`. The current file becomes
// <name>.prev.pt only if it is whole: after a resume that fell back to the
// previous checkpoint, the damaged newest one never replaces it. The new
// file replaces `path` only once it has been written, synced and read back
// whole. A failure at any step leaves both files as they were.
void rotate_in(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = write_temporary(path, bytes);
  try {
    const auto back = pickle::read_file(tmp);
    zip::Archive(back.data(), back.size(), tmp).verify_all();
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    throw CheckpointError("writing " + path + ": the new file did not read back whole (" + e.what() + "); " + path +
                          " and the previous checkpoint are untouched. Check the disk");
  }
  if (std::filesystem::exists(path)) {
    const std::string prev = previous_checkpoint_path(path), prev_tmp = prev + ".tmp";
    const std::string why = why_not_whole(path);
    if (why.empty()) {
      // A hard link, so that `path` never disappears.
      ::unlink(prev_tmp.c_str());
      if (::link(path.c_str(), prev_tmp.c_str()) == 0 && ::rename(prev_tmp.c_str(), prev.c_str()) == 0) remember_good(prev);
    } else {
      std::cout << "notice: " << path << " is not kept as " << prev << ": it is damaged (" << why
                << "); " << prev << " stays as it was" << std::endl;
    }
  }
  replace_with_temporary(path);
  remember_good(path);
}

// The checkpoint's parts as they are now: the model's tensors and the
// optimizer's state by reference (not copies), its archive serialized here.
// Without the optimizer (with_optimizer false): its entry is empty.
detail::CheckpointParts parts_of(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                                 const TrainState& state, int world_size, std::vector<at::Tensor> all_rng,
                                 bool with_optimizer = true) {
  detail::CheckpointParts parts;
  parts.model = state_dict(model);
  if (with_optimizer) {
    std::ostringstream bytes;
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(bytes);
    parts.optimizer = bytes.str();
  }
  parts.position = state;
  parts.scaler = state.scaler ? state.scaler->state_dict() : std::nullopt;
  parts.world_size = world_size;
  parts.rng = std::move(all_rng);
  return parts;
}

std::vector<char> checkpoint_bytes(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                                   const TrainState& state, int world_size, const std::vector<at::Tensor>& all_rng,
                                   bool with_optimizer = true) {
  return detail::pickle_checkpoint(parts_of(model, optimizer, state, world_size, all_rng, with_optimizer));
}


// Rank 0's read of the checkpoint into `bytes`, checked; the previous one
// (`used` then names it) when the newest is damaged. "" or why neither reads.
std::string read_with_fallback(const std::string& path, std::vector<char>& bytes, std::string& used) {
  std::string error;
  try {
    bytes = pickle::read_file(path);
    parse_checkpoint(bytes, path);
  } catch (const std::exception& first) {
    const std::string prev = previous_checkpoint_path(path);
    error = first.what();
    if (std::filesystem::exists(prev)) {
      try {
        bytes = pickle::read_file(prev);
        parse_checkpoint(bytes, prev);
        std::cout << "notice: " << first.what() << "\nnotice: resuming from the previous checkpoint " << prev
                  << " instead" << std::endl;
        used = prev;
        error.clear();
      } catch (const std::exception& second) {
        error += "\n  and the previous checkpoint " + prev + " is no better: " + second.what();
      }
    }
  }
  return error;
}


void load_optimizer(const pickle::ValuePtr& root, const std::string& used, torch::optim::Optimizer& optimizer,
                    const torch::Device& device, const ProcessGroup& pg) {
  auto opt = root->get("optimizer");
  if (!opt || !opt->is_tensor()) throw CheckpointError(used + ": checkpoint has no optimizer state");
  const std::string opt_bytes = tensor_bytes(opt->tensor);
  // Read as data only (module_archive.h): LibTorch's own reader would run
  // the archive's code.
  auto archive = module_archive::read(opt_bytes.data(), opt_bytes.size(), used + ": its optimizer state", device);
  try {
    optimizer.load(archive);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    throw CheckpointError(rank_tag(pg) + ": " + used + ": the optimizer state does not fit this optimizer (" +
                          msg.substr(0, msg.find('\n')) + "); was it written with another optimizer or model?");
  }
}


// The checkpoint's "model" entry, loaded; the device of the model's first
// parameter, where the optimizer's state goes.
torch::Device load_model(const pickle::ValuePtr& root, const std::string& used, torch::nn::Module& model) {
  StateDict model_state;
  if (!detail::to_state_dict(root->get("model"), model_state))
    throw CheckpointError(used + ": checkpoint entry \"model\" is not a dict of tensors; corrupt file?");
  load_state_dict(model, model_state);
  for (const auto& p : model.parameters()) return p.device();
  return torch::kCPU;
}

}  // namespace

std::string previous_checkpoint_path(const std::string& path) {
  std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + ".prev" + p.extension().string())).string();
}

void save_checkpoint(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                     const TrainState& state, ProcessGroup& pg) {
  // A ZeRO optimizer holds a share of the state on each rank: gather it on
  // rank 0 first (collective, as this function is). Consolidation is a
  // snapshot beside the shards and leaves them as they are.
  // A failure after its collectives (rank 0 alone builds the whole state)
  // becomes rank 0's verdict below, so that no rank waits for the others.
  std::string error;
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) {
    try {
      const_cast<ZeroRedundancyOptimizer*>(zero)->consolidate_state_dict(0);
    } catch (const CommError&) {
      throw;  // a collective failed: every rank learns it from its own
    } catch (const std::exception& e) {
      error = std::string("consolidating the ZeRO optimizer's state: ") + e.what();
    }
  }
  // Every rank's generator: ranks may draw different random numbers (dropout).
  auto rng = cpu_rng_state();
  auto all_rng = pg.allgather(rng.to(pg.device()));
  if (pg.rank() != 0) {
    share_verdict(pg, true, "to write the checkpoint " + path);
    if (!error.empty()) throw CheckpointError(rank_tag(pg) + ": " + error);
    return;
  }
  if (error.empty()) try {
    rotate_in(path, checkpoint_bytes(model, optimizer, state, pg.size(), all_rng));
  } catch (const std::exception& e) {
    error = e.what();
  }
  share_verdict(pg, error.empty(), "to write the checkpoint " + path);
  if (!error.empty()) throw CheckpointError(rank_tag(pg) + ": " + error);
}

TrainState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                           ProcessGroup& pg, GradScaler* scaler) {
  return load_checkpoint(path, model, optimizer, pg, scaler, nullptr);
}

TrainState load_checkpoint(
    const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer, ProcessGroup& pg,
    GradScaler* scaler,
    const std::function<void(const std::map<std::string, std::string>& config, const std::string& file)>& check_config) {
  // Rank 0 decides what `path` is: a rank that cannot see the folder then
  // says so instead of reading something else.
  if (detail::broadcast_flag(
          pg, pg.rank() == 0 && (detail::is_sharded_checkpoint(path) || detail::is_sharded_manifest(path)), 0))
    return detail::load_sharded(path, model, optimizer, pg, scaler, check_config);
  // Rank 0 reads (and checks) the file, then everyone gets its bytes.
  std::vector<char> bytes;
  std::string used = path;
  const std::string error = pg.rank() == 0 ? read_with_fallback(path, bytes, used) : std::string();
  share_verdict(pg, error.empty(), "to read the checkpoint " + path);
  if (!error.empty()) throw CheckpointError(rank_tag(pg) + ": cannot resume: " + error);
  {
    const std::string shared = detail::broadcast_bytes(pg, std::string(bytes.begin(), bytes.end()), 0);
    if (pg.rank() != 0) bytes.assign(shared.begin(), shared.end());
    used = detail::broadcast_bytes(pg, used, 0);  // rank 0 may have fallen back to the previous file
  }

  auto root = parse_checkpoint(bytes, used);
  if (pg.rank() == 0) remember_good(used);
  TrainState state = read_position(root, used);
  state.scaler = scaler;
  // Before the model: a changed option names itself, not a shape mismatch.
  if (check_config) check_config(state.config, used);
  state.extra = detail::extra_from_pickle(root->get("extra"), used);
  const torch::Device device = load_model(root, used, model);
  if (optimizer) load_optimizer(root, used, *optimizer, device, pg);
  if (scaler && scaler->is_enabled()) load_scaler(root, used, *scaler, pg);
  if (!root->get("epoch_samples") && state.epoch_step > 0) state.epoch_samples = old_epoch_samples(state, used);
  load_rng_state(root, used, state.world_size, pg);
  if (state.world_size != pg.size() && pg.rank() == 0)
    std::cout << "notice: " << used << " was written by " << state.world_size << " ranks; resuming with "
              << pg.size() << ". The model and optimizer carry over (a ZeRO optimizer takes each rank's share of "
              << "the whole state); the data position carries over exactly: the samples of the epoch not yet "
              << "taken go to the " << pg.size() << " ranks, in shards of the new size; random streams are "
              << "reused round-robin." << std::endl;
  return state;
}

// ---- a running group's state, for a rank that joins it (live_state.h) ----

namespace detail {

c10::impl::GenericDict common_entries(const CheckpointParts& parts, const std::string& format) {
  const TrainState& state = parts.position;
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", format);
  d.insert("version", kVersion);
  d.insert("epoch", state.epoch);
  d.insert("step", state.step);
  d.insert("sampler_epoch", state.sampler_epoch);
  d.insert("epoch_step", state.epoch_step);
  d.insert("epoch_samples", state.epoch_samples);
  d.insert("world_size", static_cast<int64_t>(parts.world_size));
  c10::List<at::Tensor> rng_list;
  for (auto& t : parts.rng) rng_list.push_back(t.cpu());
  d.insert("rng_states", rng_list);
  c10::Dict<std::string, std::string> config;
  for (auto& [k, v] : state.config) config.insert(k, v);
  d.insert("config", config);
  d.insert("extra", extra_to_ivalue(state.extra));
  if (const auto& scaler = parts.scaler) {
    // PyTorch's GradScaler.state_dict(), key for key.
    c10::impl::GenericDict s(c10::StringType::get(), c10::AnyType::get());
    s.insert("scale", scaler->scale);
    s.insert("growth_factor", scaler->growth_factor);
    s.insert("backoff_factor", scaler->backoff_factor);
    s.insert("growth_interval", scaler->growth_interval);
    s.insert("_growth_tracker", scaler->growth_tracker);
    d.insert("scaler", s);
  }
  return d;
}

// The checkpoint's pickled dict: the model, the optimizer's archive, where
// the run is, every rank's generator, the config and the extras, and the
// loss scaler's state where there is one.
std::vector<char> pickle_checkpoint(const CheckpointParts& parts) {
  std::string optimizer = parts.optimizer;
  if (parts.optimizer_archive) {
    std::ostringstream bytes;
    parts.optimizer_archive->save_to(bytes);
    optimizer = bytes.str();
  }
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  // format and version first, then model and optimizer: the order of the
  // file save_checkpoint has always written.
  const auto common = common_entries(parts, kFormat);
  for (const char* key : {"format", "version"}) d.insert(key, common.at(key));
  d.insert("model", to_ivalue(parts.model));
  d.insert("optimizer", bytes_tensor(optimizer));
  for (const auto& item : common)
    if (!d.contains(item.key())) d.insert(item.key(), item.value());
  return torch::pickle_save(d);
}

void write_checkpoint_file(const std::string& path, const std::vector<char>& bytes) { rotate_in(path, bytes); }

std::string live_state_bytes(const TrainState& state, const ProcessGroup& pg) {
  if (!state.model || !state.optimizer)
    throw UsageError(rank_tag(pg) + ": a rank joins the group, and this one cannot hand it the state: the model "
                     "and optimizer are known from resume_or_start, which this program did not call");
  // A ZeRO optimizer hands its shards over itself, as the group grows.
  const bool zero = dynamic_cast<const ZeroRedundancyOptimizer*>(state.optimizer) != nullptr;
  const auto bytes = checkpoint_bytes(*state.model, *state.optimizer, state, pg.size(), {cpu_rng_state()}, !zero);
  return std::string(bytes.begin(), bytes.end());
}

void save_checkpoint_alone(const std::string& path, const TrainState& state) {
  if (!state.model || !state.optimizer) throw UsageError("save_checkpoint_alone: no model or optimizer in the state");
  if (dynamic_cast<const ZeroRedundancyOptimizer*>(state.optimizer))
    throw CheckpointError("a ZeroRedundancyOptimizer's state is spread over the ranks, and one rank cannot save it "
                          "alone; the last checkpoint written (" + path + ") stands");
  rotate_in(path, checkpoint_bytes(*state.model, *state.optimizer, state, 1, {cpu_rng_state()}));
}

TrainState load_live_state(const std::string& bytes, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           ProcessGroup& pg, GradScaler* scaler) {
  const std::string from = "the running group's state";
  auto root = parse_checkpoint(std::vector<char>(bytes.begin(), bytes.end()), from);
  TrainState state = read_position(root, from);
  state.extra = extra_from_pickle(root->get("extra"), from);
  const torch::Device device = load_model(root, from, model);
  if (!dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) load_optimizer(root, from, optimizer, device, pg);
  if (scaler && scaler->is_enabled()) load_scaler(root, from, *scaler, pg);
  load_rng_state(root, from, 1, pg);  // the sender's stream
  return state;
}

}  // namespace detail

}  // namespace ddp
