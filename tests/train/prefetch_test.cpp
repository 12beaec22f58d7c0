// ddp::Prefetcher (ddp/train/prefetch.h) on CPUs: every batch in order, a
// loop that stops early, a loader's exception, a loader that hangs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ddp/errors.h"
#include "ddp/train/prefetch.h"

namespace {

std::atomic<bool> g_release_hung{false};  // static: a detached thread may still read it at exit

// A loader of `n` batches (data = the batch's number), as torch::data's
// iterators behave: begin() fetches the first, ++ the next. Batch `fail_at`
// throws; batch `hang_at` never comes.
struct CountingLoader {
  int n = 0, fail_at = -1, hang_at = -1;
  std::atomic<int> fetched{0};
  struct Iterator {
    CountingLoader* loader;
    int i;
    torch::data::Example<> batch;
    void fetch() {
      if (i >= loader->n) return;
      if (i == loader->fail_at) throw std::runtime_error("batch " + std::to_string(i) + " is corrupt");
      while (i == loader->hang_at && !g_release_hung) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++loader->fetched;
      batch = {torch::full({2, 3}, static_cast<double>(i)), torch::full({2}, i, torch::kLong)};
    }
    torch::data::Example<>& operator*() { return batch; }
    Iterator& operator++() {
      ++i;
      fetch();
      return *this;
    }
    bool operator!=(const Iterator& other) const { return i != other.i; }
  };
  Iterator begin() {
    Iterator it{this, 0, {}};
    it.fetch();
    return it;
  }
  Iterator end() { return {this, n, {}}; }
};

TEST(Prefetcher, EveryBatchInOrderOnTheDevice) {
  CountingLoader loader;
  loader.n = 7;
  ddp::Prefetcher<CountingLoader> batches(loader, torch::kCPU);
  for (int i = 0; i < 7; ++i) {
    auto b = batches.next();
    ASSERT_TRUE(b.has_value()) << i;
    EXPECT_EQ(b->data[0][0].item<double>(), i);
    EXPECT_EQ(b->target[1].item<int64_t>(), i);
    EXPECT_TRUE(b->data.device().is_cpu());
  }
  EXPECT_FALSE(batches.next().has_value());
  EXPECT_FALSE(batches.next().has_value()) << "the end stays the end";
}

TEST(Prefetcher, ALoopThatStopsEarlyFetchesAtMostTheDepthMore) {
  CountingLoader loader;
  loader.n = 100;
  {
    ddp::Prefetcher<CountingLoader> batches(loader, torch::kCPU, std::chrono::seconds(30), 2);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(batches.next().has_value());
  }
  EXPECT_LE(loader.fetched.load(), 3 + 2 + 1) << "3 taken, 2 queued, 1 in the thread's hands";
}

TEST(Prefetcher, ALoadersExceptionComesAfterTheBatchesBeforeIt) {
  CountingLoader loader;
  loader.n = 10;
  loader.fail_at = 4;
  ddp::Prefetcher<CountingLoader> batches(loader, torch::kCPU);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(batches.next().has_value());
  try {
    batches.next();
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "batch 4 is corrupt");
  }
}

// A loader that hangs is a DataError within the timeout, and the
// Prefetcher's end does not wait for it (if it did, this test would hang:
// the loader is released only after).
TEST(Prefetcher, ALoaderThatHangsIsADataErrorWithinTheTimeout) {
  static CountingLoader loader;  // outlives the thread left in it
  loader.n = 10;
  loader.hang_at = 2;
  {
    ddp::Prefetcher<CountingLoader> batches(loader, torch::kCPU, std::chrono::milliseconds(300));
    ASSERT_TRUE(batches.next().has_value());
    ASSERT_TRUE(batches.next().has_value());
    EXPECT_THROW(batches.next(), ddp::DataError);
  }
  g_release_hung = true;
}

}  // namespace
