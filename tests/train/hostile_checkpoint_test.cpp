// Crafted and damaged files given to read_state_dict and load_checkpoint:
// deep nesting, offsets, sizes and strides that overflow or disagree, missing
// storages, flipped bytes, truncated zips and offsets outside the file. Each
// must be a CheckpointError that names the problem, never a crash or a tensor
// holding bytes from outside its storage. The files are made here, with a
// small zip writer and pickle builder, so the test needs no Python.
#include <gtest/gtest.h>
#include <zlib.h>

#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "../support/idx_fixture.h"
#include "../support/multiprocess.h"
#include "crafted_files.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/state_dict.h"

namespace fs = std::filesystem;

using namespace ddp::crafted;

namespace {

// ---- running the readers ---------------------------------------------------

struct Outcome {
  bool threw_checkpoint_error = false;
  std::string message;  // its what(), or what else happened
};

Outcome read(const std::string& path) {
  Outcome o;
  try {
    auto sd = ddp::read_state_dict(path);
    o.message = "no error; read " + std::to_string(sd.size()) + " tensors";
  } catch (const ddp::CheckpointError& e) {
    o.threw_checkpoint_error = true;
    o.message = e.what();
  } catch (const std::exception& e) {
    o.message = std::string("not a CheckpointError: ") + e.what();
  }
  return o;
}

class HostileCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ddp::testing::temp_dir("hostile"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // read_state_dict(file) must be a CheckpointError naming the file and every needle.
  void expect_error(const std::string& name, const std::string& bytes, const std::vector<std::string>& needles) {
    const auto o = read(write(name, bytes));
    EXPECT_TRUE(o.threw_checkpoint_error) << name << ": " << o.message;
    EXPECT_NE(o.message.find(name), std::string::npos) << "names the file: " << o.message;
    for (const auto& n : needles) EXPECT_NE(o.message.find(n), std::string::npos) << name << ": " << o.message;
  }

  std::string dir_;
};

// A world of one for save_checkpoint/load_checkpoint.
std::shared_ptr<ddp::ProcessGroup> single_group() {
  ddp::LaunchEnv env;
  env.master_port = static_cast<uint16_t>(ddp::testing::free_port());
  return ddp::init_process_group(env, ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
}

}  // namespace

// The helpers above make a file the reader accepts: the tests below differ from it in one thing.
TEST_F(HostileCheckpoint, TheCraftedBaselineLoads) {
  auto sd = ddp::read_state_dict(write("good.pt", make_zip(archive(state_dict_pkl({}))).bytes));
  ASSERT_TRUE(sd.contains("w"));
  EXPECT_TRUE(torch::equal(sd["w"], torch::arange(1, 7, torch::kFloat).reshape({2, 3})));
}

TEST_F(HostileCheckpoint, NestingHundredThousandDeepIsRefused) {
  const int n = 100000;
  // Tuples wrapping tuples (TUPLE1), lists in lists (MARK ... LIST), and a
  // chain hidden from a depth count by filling lists after nesting them (memo).
  std::string tuples = "\x80\x02)" + std::string(n, '\x85') + ".";
  std::string lists = "\x80\x02" + std::string(n, '(') + std::string(n, 'l') + ".";
  std::string chain = "\x80\x02";
  auto memo = [](char op, uint32_t k) {
    std::string s(1, op);
    put(s, k, 4);
    return s;
  };
  for (int k = 0; k <= n; ++k) chain += "]" + memo('r', k) + "0";
  for (int k = 0; k < n; ++k) chain += memo('j', k) + memo('j', k + 1) + "a0";
  chain += memo('j', 0) + ".";
  std::string cycle = "\x80\x02]2a.";  // a list that holds itself
  for (const auto& [name, pkl] : std::vector<std::pair<std::string, std::string>>{
           {"tuples.pt", tuples}, {"lists.pt", lists}, {"chain.pt", chain}, {"cycle.pt", cycle}})
    expect_error(name, make_zip(archive(pkl)).bytes, {"nest"});
}

TEST_F(HostileCheckpoint, StorageOffsetOverflowIsRefused) {
  TensorSpec t;
  t.offset = INT64_MAX;
  t.sizes = {1};
  t.strides = {1};
  expect_error("offset_max.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"offset", "storage"});
  t.offset = 6;  // one past the end
  expect_error("offset_end.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"outside its storage"});
  t.offset = -1;
  expect_error("offset_negative.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"negative"});
}

TEST_F(HostileCheckpoint, SizesWhoseProductOverflowsAreRefused) {
  TensorSpec t;
  t.sizes = {int64_t(1) << 32, int64_t(1) << 32};  // zero strides pass an extent check alone
  t.strides = {0, 0};
  expect_error("numel_overflow.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"overflow"});
  t.sizes = {int64_t(1) << 40, int64_t(1) << 40};
  t.strides = {int64_t(1) << 40, 1};
  expect_error("extent_overflow.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"overflow"});
}

TEST_F(HostileCheckpoint, SizesAndStridesOfDifferentLengthAreRefused) {
  TensorSpec t;
  t.sizes = {2, 3, 1, 1, 1, 1, 1, 1};
  t.strides = {3};
  expect_error("short_strides.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"8 sizes", "1 strides"});
}

TEST_F(HostileCheckpoint, NegativeSizesAndStridesAreRefused) {
  TensorSpec t;
  t.sizes = {-1, 3};
  expect_error("negative_size.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"negative size"});
  t.sizes = {2, 3};
  t.strides = {-3, 1};
  t.offset = 3;
  expect_error("negative_stride.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"negative stride"});
}

TEST_F(HostileCheckpoint, StorageFieldsAreCheckedAgainstTheArchive) {
  TensorSpec t;
  t.key = "7";
  expect_error("missing_storage.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"archive/data/7", "missing"});
  t.key = "0";
  t.storage = "EvilStorage";
  expect_error("unknown_dtype.pt", make_zip(archive(state_dict_pkl(t))).bytes, {"torch.EvilStorage"});
  t.storage = "FloatStorage";
  expect_error("ragged_storage.pt", make_zip(archive(state_dict_pkl(t), kWeights + "xyz")).bytes,
               {"27 bytes", "4-byte"});
  // A tensor rebuilt on top of another tensor, not on a storage: its numel is not its storage's size.
  TensorSpec wide;
  wide.sizes = {1000};
  wide.strides = {0};
  const std::string view_of_view = "\x80\x02}(" + str("w") + global("torch._utils", "_rebuild_tensor_v2") + "(" +
                                   tensor_pkl(wide) + i64(100) + tuple({1}) + tuple({1}) + "\x89" +
                                   global("collections", "OrderedDict") + ")RtRu.";
  expect_error("view_of_view.pt", make_zip(archive(view_of_view)).bytes, {"not a storage"});
}

TEST_F(HostileCheckpoint, FlippedByteInAStoredWeightIsACrcErrorNamingTheEntry) {
  auto z = make_zip(archive(state_dict_pkl({})));
  const size_t weights = z.bytes.find(kWeights);
  ASSERT_NE(weights, std::string::npos);
  z.bytes[weights + 5] ^= 0x40;  // 2.0f becomes a huge number: a run would train on it
  expect_error("flipped.pt", z.bytes, {"archive/data/0", "CRC-32"});
  // And a CRC that disagrees with intact data is the same error (the directory or the data is damaged).
  auto entries = archive(state_dict_pkl({}));
  entries[0].wrong_crc = true;
  expect_error("bad_crc.pt", make_zip(entries).bytes, {"archive/data.pkl", "CRC-32"});
}

TEST_F(HostileCheckpoint, EveryTruncationIsAClearError) {
  const auto z = make_zip(archive(state_dict_pkl({}))).bytes;
  for (size_t cut = 1; cut < z.size(); ++cut) {
    const auto o = read(write("cut.pt", z.substr(0, cut)));
    EXPECT_TRUE(o.threw_checkpoint_error) << "cut at " << cut << ": " << o.message;
  }
}

TEST_F(HostileCheckpoint, ZipOffsetsOutsideTheFileAreRefused) {
  const auto base = make_zip(archive(state_dict_pkl({})));
  auto patch = [&](size_t at, uint64_t v, int bytes) {
    std::string s = base.bytes;
    std::string field;
    put(field, v, bytes);
    s.replace(at, static_cast<size_t>(bytes), field);
    return s;
  };
  const size_t eocd = base.eocd_offset, central = base.central_offset;
  // The central directory's offset and size, a local header's offset, an entry's size.
  expect_error("cd_offset.pt", patch(eocd + 16, 0xfffffff0u, 4), {"central directory"});
  expect_error("cd_size.pt", patch(eocd + 12, 0xfffffff0u, 4), {"central directory"});
  expect_error("entry_count.pt", patch(eocd + 10, 0xffff, 2), {"central directory"});
  expect_error("local_offset.pt", patch(central + 42, 0xffffff00u, 4), {"archive/data.pkl"});
  expect_error("entry_size.pt", patch(central + 20, 0x7fffffffu, 4), {"archive/data.pkl"});
  expect_error("name_length.pt", patch(central + 28, 0xffff, 2), {"central directory"});
  // A local header offset that lands on another entry: names disagree.
  expect_error("wrong_entry.pt", patch(central + 42, base.local_offsets[1], 4), {"archive/data.pkl"});
  // A compression method PyTorch never uses (bzip2).
  expect_error("bzip2.pt", patch(central + 10, 12, 2), {"compressed with method"});
}

TEST_F(HostileCheckpoint, ReadStateDictReadsOurOwnCheckpoint) {
  auto pg = single_group();
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(3, 2), torch::nn::BatchNorm1d(2));
  torch::optim::Adam opt(net->parameters(), 0.01);  // an optimizer archive holds constants.pkl
  net->forward(torch::randn({4, 3})).sum().backward();
  opt.step();
  ddp::save_checkpoint(dir_ + "/checkpoint.pt", *net, opt, ddp::TrainState{}, *pg);
  ddp::destroy_process_group();
  const auto o = read(dir_ + "/checkpoint.pt");
  ASSERT_TRUE(o.message.rfind("no error", 0) == 0) << o.message;
  auto sd = ddp::read_state_dict(dir_ + "/checkpoint.pt");
  auto expected = ddp::state_dict(*net);
  ASSERT_EQ(sd.size(), expected.size());
  for (auto& item : expected) EXPECT_TRUE(torch::equal(item.value(), sd[item.key()])) << item.key();
}

TEST_F(HostileCheckpoint, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  auto pg = single_group();
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  torch::NoGradGuard no_grad;
  net->named_parameters()["0.weight"].fill_(1234.5f);  // bytes easy to find in the file
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::TrainState state;
  const std::string path = dir_ + "/checkpoint.pt";
  state.epoch = 1;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  state.epoch = 2;
  ddp::save_checkpoint(path, *net, opt, state, *pg);

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const float w = 1234.5f;
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&w), sizeof w));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] ^= 0x7f;  // 1234.5 becomes another number, silently
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  ::testing::internal::CaptureStdout();
  ddp::TrainState got;
  try {
    got = ddp::load_checkpoint(path, *net, &opt, *pg);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "no fallback: " << e.what();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(got.epoch, 1) << "resumes from checkpoint.prev.pt; stdout: " << out;
  EXPECT_NE(out.find("checkpoint.prev.pt"), std::string::npos) << out;
  EXPECT_NE(out.find(path), std::string::npos) << "names the corrupt file: " << out;
  EXPECT_NE(out.find("CRC-32"), std::string::npos) << "says what is wrong: " << out;
  EXPECT_EQ(net->named_parameters()["0.weight"][0][0].item<float>(), 1234.5f);
  ddp::destroy_process_group();
}
