// A program's own state and options in the kit's checkpoints: TrainState's
// "extra" entries through save/load and through Python's torch.load (and
// back), plain data only; options registered with add_option recorded in
// the config and checked on resume.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "../support/multiprocess.h"
#include "crafted_files.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/train_options.h"
#include "python_run.h"
#include "../support/python_server.h"

namespace fs = std::filesystem;

namespace {

torch::nn::Sequential small_net() { return torch::nn::Sequential(torch::nn::Linear(3, 2)); }

using ddp::testing::python_torch;

std::string python(const std::vector<std::string>& args) { return ddp::testing::python_script(PYTHON_CHECKS, args); }

std::shared_ptr<ddp::ProcessGroup> single_group() {
  ddp::LaunchEnv env;
  env.master_port = static_cast<uint16_t>(ddp::testing::free_port());
  return ddp::init_process_group(env, ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
}

ddp::TrainOptions parse(std::vector<std::string> args, ddp::TrainOptions defaults) {
  args.insert(args.begin(), "charlm");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ddp::parse_train_options(static_cast<int>(argv.size()), argv.data(), defaults);
}

// A character LM's options: a model option, an option that may change.
ddp::TrainOptions charlm_defaults() {
  return ddp::TrainOptions()
      .lr(0.003)
      .preemption_check_every(0)
      .add_option("dim", 256, "embedding width")
      .add_option("sample-len", 200, "characters sampled after each epoch", ddp::OnResume::may_change);
}

// What a program keeps: a scheduler's state, the best loss, and one of each kind.
std::map<std::string, c10::IValue> program_state() {
  auto inner = ddp::extra_dict();
  inner.insert("names", c10::List<std::string>({"a", "b"}));
  inner.insert("t", torch::tensor({1, 2}, torch::kLong));
  auto scheduler = ddp::extra_dict();
  scheduler.insert("base_lrs", std::vector<double>{0.003});
  scheduler.insert("gamma", 0.5);
  scheduler.insert("inner", inner);
  scheduler.insert("last_epoch", int64_t(4));
  c10::Dict<int64_t, double> by_epoch;
  by_epoch.insert(1, 0.5);
  by_epoch.insert(2, 0.25);
  return {{"best_loss", 0.125},
          {"by_epoch", by_epoch},
          {"embedding", torch::arange(6, torch::kFloat).reshape({2, 3})},
          {"losses", std::vector<double>{2.5, 1.25}},
          {"milestones", std::vector<int64_t>{10, 20}},
          {"nothing", c10::IValue()},
          {"pair", c10::ivalue::Tuple::create({int64_t(1), std::string("x")})},
          {"scheduler", scheduler},
          {"tokenizer", "bytes"},
          {"warm", true}};
}

std::string checkpoint_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::CheckpointError& e) {
    return e.what();
  }
  return "";
}

// A checkpoint's data.pkl, written by hand: the counts load_checkpoint reads
// first, then `entries` (pickled keys and values), and no model: whatever
// `entries` holds is read before the model is missed.
std::string checkpoint_pkl(const std::string& entries) {
  using namespace ddp::crafted;
  return "\x80\x02}(" + str("format") + str("libddp-checkpoint") + str("version") + i64(1) + str("epoch") + i64(0) +
         str("step") + i64(0) + str("sampler_epoch") + i64(0) + str("world_size") + i64(1) + entries + "u.";
}

std::string write_checkpoint(const std::string& path, const std::string& entries) {
  std::ofstream(path, std::ios::binary) << ddp::crafted::make_zip({{"archive/data.pkl", checkpoint_pkl(entries)}}).bytes;
  return path;
}

// Pickle memo opcodes: BINPUT and BINGET of slot k.
std::string put(int k) { return {'q', static_cast<char>(k)}; }
std::string get(int k) { return {'h', static_cast<char>(k)}; }

// L0 = ["x"], Lk = [Lk-1, Lk-1]: n + 1 lists in the file, 2^n strings in the tree they make.
std::string doubling_lists(int n) {
  std::string out = "]" + ddp::crafted::str("x") + "a" + put(0);
  for (int k = 1; k <= n; ++k) out += "0](" + get(k - 1) + get(k - 1) + "e" + put(k);
  return out;
}

size_t depth_of(const c10::IValue& v) { return v.isList() ? 1 + depth_of(v.toListRef()[0]) : 0; }

int64_t max_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace

TEST(ProgramState, ExtraEntriesRoundTripThroughSaveLoadAndPythonsTorchLoad) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("extra");
  const std::string path = dir + "/checkpoint.pt";
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::TrainState state;
  state.config = parse({}, charlm_defaults()).to_config();
  state.extra = program_state();
  ddp::save_checkpoint(path, *net, opt, state, *pg);

  auto back = ddp::load_checkpoint(path, *net, &opt, *pg);
  ASSERT_EQ(back.extra.size(), 10u);
  EXPECT_EQ(back.extra.at("best_loss").toDouble(), 0.125);
  EXPECT_EQ(back.extra.at("tokenizer").toStringRef(), "bytes");
  EXPECT_TRUE(back.extra.at("warm").toBool());
  EXPECT_TRUE(back.extra.at("nothing").isNone());
  EXPECT_EQ(back.extra.at("milestones").toIntVector(), (std::vector<int64_t>{10, 20})) << "a typed list stays typed";
  EXPECT_EQ(back.extra.at("losses").toDoubleVector(), (std::vector<double>{2.5, 1.25}));
  EXPECT_TRUE(torch::equal(back.extra.at("embedding").toTensor(), torch::arange(6, torch::kFloat).reshape({2, 3})));
  const auto& pair = back.extra.at("pair").toTupleRef().elements();
  EXPECT_EQ(pair.at(0).toInt(), 1);
  EXPECT_EQ(pair.at(1).toStringRef(), "x");
  const auto by_epoch = back.extra.at("by_epoch").toGenericDict();
  EXPECT_EQ(by_epoch.at(int64_t(2)).toDouble(), 0.25) << "int keys stay ints";
  const auto scheduler = back.extra.at("scheduler").toGenericDict();
  EXPECT_EQ(scheduler.at("last_epoch").toInt(), 4);
  EXPECT_EQ(scheduler.at("base_lrs").toDoubleVector(), std::vector<double>{0.003});
  const auto inner = scheduler.at("inner").toGenericDict();
  EXPECT_TRUE(torch::equal(inner.at("t").toTensor(), torch::tensor({1, 2}, torch::kLong)));
  EXPECT_EQ(inner.at("names").toListRef().size(), 2u);
  EXPECT_EQ(inner.at("names").toListRef()[1].toStringRef(), "b");

  if (python_torch()) {
    EXPECT_EQ(python({"extra", path}),
              "best_loss float 0.125\n"
              "by_epoch dict {1: 0.5, 2: 0.25}\n"
              "embedding Tensor tensor(float32 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])\n"
              "losses list [2.5, 1.25]\n"
              "milestones list [10, 20]\n"
              "nothing NoneType None\n"
              "pair tuple (1, 'x')\n"
              "scheduler dict {'base_lrs': [0.003], 'gamma': 0.5, 'inner': {'names': ['a', 'b'], 't': tensor(int64 "
              "[1, 2])}, 'last_epoch': 4}\n"
              "tokenizer str 'bytes'\n"
              "warm bool True\n"
              "config 256 200 0.003\n");
    // Python edits the entries with plain dicts and lists; the kit reads them back.
    ASSERT_EQ(python({"extra-edit", path}), "saved\n");
    auto edited = ddp::load_checkpoint(path, *net, &opt, *pg);
    EXPECT_EQ(edited.extra.at("best_loss").toDouble(), 0.25);
    const auto from_python = edited.extra.at("from_python").toGenericDict();
    EXPECT_EQ(from_python.at("note").toStringRef(), "edited");
    EXPECT_EQ(from_python.at("ids").toIntVector(), (std::vector<int64_t>{3, 1, 2}));
    EXPECT_EQ(from_python.at("mixed").toListRef().size(), 3u);
    EXPECT_TRUE(from_python.at("mixed").toListRef()[2].isNone());
    EXPECT_EQ(from_python.at("empty").toListRef().size(), 0u);
    EXPECT_EQ(edited.extra.at("milestones").toIntVector(), (std::vector<int64_t>{10, 20}));
    const auto shared = edited.extra.at("shared").toGenericDict();
    const auto tags = shared.at("tags").toListRef();
    ASSERT_EQ(tags.size(), 1000u) << "one string in a thousand places reads back";
    std::string tag;
    for (int k = 0; k < 100; ++k) tag += "edited";
    EXPECT_EQ(tags[999].toStringRef(), tag);
    EXPECT_EQ(shared.at("rows").toListRef()[1].toIntVector(), (std::vector<int64_t>{1, 2}));
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

// The entries are data: nothing in them is run or kept as a live object.
TEST(ProgramState, ExtraEntriesThatAreNotPlainDataAreRefusedBothWays) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("extra_bad");
  const std::string path = dir + "/checkpoint.pt";
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::TrainState state;
  auto nested = ddp::extra_dict();
  nested.insert("where", c10::IValue(c10::Device(torch::kCPU)));
  state.extra["scheduler"] = nested;
  auto msg = checkpoint_error([&] { ddp::save_checkpoint(path, *net, opt, state, *pg); });
  EXPECT_NE(msg.find("extra[\"scheduler\"][\"where\"]: a Device is not plain data"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path)) << "nothing written";

  state.extra = {{"best_loss", 1.5}};
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  if (python_torch()) {
    ASSERT_EQ(python({"extra-object", path, dir + "/object.pt"}), "saved\n");
    msg = checkpoint_error([&] { ddp::load_checkpoint(dir + "/object.pt", *net, &opt, *pg); });
    EXPECT_NE(msg.find("extra[\"hook\"][\"run\"] is the Python name posix.system, not plain data"), std::string::npos)
        << msg;
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

TEST(ProgramState, ResumeRefusesAChangedModelOptionAndTakesAChangedFreeOne) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("resume_opts");
  ddp::RunDir run(dir, *pg);
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  {
    const auto opts = parse({"--run-dir", dir, "--dim", "64"}, charlm_defaults());
    auto state = ddp::resume_or_start(opts, run, *net, opt, *pg);
    EXPECT_EQ(state.config.at("dim"), "64") << "recorded";
    state.epoch = 1;
    state.extra["best_loss"] = 0.75;
    ddp::save_checkpoint(run.checkpoint_path(), *net, opt, state, *pg);
  }
  // The model here would load either way: the option's record is what refuses it.
  const auto changed = parse({"--run-dir", dir, "--resume", "--dim", "128"}, charlm_defaults());
  try {
    ddp::resume_or_start(changed, run, *net, opt, *pg);
    ADD_FAILURE() << "a changed --dim resumed";
  } catch (const ddp::UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--dim is 128, but " + run.checkpoint_path() + " was written with --dim 64"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("Resume with --dim 64"), std::string::npos) << msg;
  }
  const auto same = parse({"--run-dir", dir, "--resume", "--dim", "64", "--sample-len", "50", "--epochs", "4"},
                          charlm_defaults());
  auto state = ddp::resume_or_start(same, run, *net, opt, *pg);
  EXPECT_EQ(state.epoch, 1);
  EXPECT_EQ(state.extra.at("best_loss").toDouble(), 0.75) << "the program's state is back";
  EXPECT_EQ(state.config.at("sample_len"), "50") << "a may_change option takes the new value";

  // An option the checkpoint predates is not checked, with a notice.
  ::testing::internal::CaptureStdout();
  ddp::resume_or_start(parse({"--run-dir", dir, "--resume", "--dim", "64"},
                             charlm_defaults().add_option("heads", 4, "attention heads")),
                       run, *net, opt, *pg);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("does not record --heads"), std::string::npos) << out;
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

// One value the pickle memoised, referred to from many places: read as a
// tree, a 2 KB file would make 2^60 lists, a 1 MiB string referred to 100,000
// times 100 GB, on every rank. Conversion is bounded by what the entry holds.
TEST(ProgramState, ExtraEntriesSharingOneValueManyTimesCannotOutgrowTheirFile) {
  using namespace ddp::crafted;
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("extra_shared");
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  // Sharing that Python's pickler writes for real programs still reads, as a tree.
  auto msg = checkpoint_error([&] {
    ddp::load_checkpoint(write_checkpoint(dir + "/fine.pt", str("extra") + "}(" + str("ok") + doubling_lists(10) + "u"),
                         *net, &opt, *pg);
  });
  EXPECT_NE(msg.find("checkpoint entry \"model\""), std::string::npos) << "read past extra: " << msg;

  const std::string big(1 << 20, 'x');
  std::string strings = "](" + str(big) + put(0);
  for (int k = 1; k < 100000; ++k) strings += get(0);
  strings += "e";
  // The lists again as Python's torch.save writes them, in a whole checkpoint
  // (fuzz/seeds/make_seeds.py).
  const std::string from_python = std::string(FUZZ_CORPUS) + "/checkpoint_fuzz/crash-shared-extra";
  const std::tuple<std::string, std::string, std::string> bombs[] = {
      {"lists", doubling_lists(60), ""}, {"strings", strings, ""}, {"shared", "", from_python}};
  for (const auto& [name, value, file] : bombs) {
    const auto path =
        file.empty() ? write_checkpoint(dir + "/" + name + ".pt", str("extra") + "}(" + str(name) + value + "u") : file;
    const auto rss = max_rss_mib();
    const auto start = std::chrono::steady_clock::now();
    msg = checkpoint_error([&] { ddp::load_checkpoint(path, *net, &opt, *pg); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(msg.find(path + ": checkpoint entry extra[\"" + name + "\"]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("malformed or hostile"), std::string::npos) << msg;
    EXPECT_LT(seconds, 20.0) << name;
    EXPECT_LT(max_rss_mib() - rss, 1024) << name << ": MiB more at the peak";
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

// "config" feeds the must_match check on resume: a value that is not a str
// is no option's text.
TEST(ProgramState, AConfigKeyOrValueThatIsNotAStrIsRefusedNamingIt) {
  using namespace ddp::crafted;
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("config_types");
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  const std::pair<std::string, std::string> cases[] = {
      {"}(" + str("lr") + str("0.1") + str("dim") + i64(64) + "u", "\"config\"[\"dim\"] is an int, not a str"},
      {"}(" + i64(7) + str("64") + "u", "\"config\" has a key that is an int, not a str (7)"},
      {"]", "\"config\" is a list, not a dict"}};
  for (const auto& [config, needle] : cases) {
    const auto path = write_checkpoint(dir + "/checkpoint.pt", str("config") + config);
    const auto msg = checkpoint_error([&] { ddp::load_checkpoint(path, *net, &opt, *pg); });
    EXPECT_NE(msg.find(path + ": checkpoint entry " + needle), std::string::npos) << msg;
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}
