// Batches gathered ahead of the training step, off its thread: what
// PyTorch users get from DataLoader(num_workers, pin_memory=True) and a
// prefetching loop. A thread of its own takes a loader's batches a few ahead
// of the step; on a GPU it pins each batch's tensors and copies them to the
// device on a side stream while the current step runs, so the step finds
// its batch there and the GPU does not wait for data. train_epoch
// (ddp/train/epoch_loop.h) feeds every step this way; a loop of one's own:
//
//   ddp::Prefetcher batches(*loader, device);  // after sampler.set_epoch(epoch)
//   while (auto batch = batches.next()) { auto loss = step(*batch); ... }
//
// A batch with tensor members `data` and `target` (torch::data::Example<>,
// the kit's datasets) arrives with both on `device`; any other batch type
// arrives as the loader made it. The loader is iterated on the prefetch
// thread only, from its begin() (in the constructor) to the end or until the
// Prefetcher is destroyed (which waits for the batch being gathered). An
// exception the loader throws is thrown again by next().
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/errors.h"

namespace ddp {

namespace detail {

// Host tensors copied to a GPU on a side stream, pinned first; on a CPU, the
// tensors as they are. Not a template: the CUDA calls stay in the library.
class DeviceCopy {
 public:
  explicit DeviceCopy(torch::Device device);
  // On the prefetch thread: the copies, started; `ready` marks their arrival.
  std::vector<at::Tensor> start(const std::vector<at::Tensor>& tensors, std::shared_ptr<void>& ready);
  // On the training thread: its current stream waits for the copies (the
  // host does not), and the allocator learns that stream uses them.
  void use(const std::vector<at::Tensor>& copies, const std::shared_ptr<void>& ready) const;

 private:
  torch::Device device_;
  std::shared_ptr<void> stream_;  // the side stream (CUDA)
};

template <typename B, typename = void>
struct HasDataAndTarget : std::false_type {};
template <typename B>
struct HasDataAndTarget<B, std::void_t<decltype(std::declval<B&>().data), decltype(std::declval<B&>().target)>>
    : std::bool_constant<std::is_same_v<std::decay_t<decltype(std::declval<B&>().data)>, at::Tensor> &&
                         std::is_same_v<std::decay_t<decltype(std::declval<B&>().target)>, at::Tensor>> {};

}  // namespace detail

template <typename Loader>
class Prefetcher {
 public:
  using Batch = std::decay_t<decltype(*std::declval<Loader&>().begin())>;

  // `depth` batches at most wait gathered; next() waits at most `timeout`
  // for one, then throws a DataError (a loader that hangs stops the
  // program; its thread, stuck in the loader, is left behind).
  Prefetcher(Loader& loader, torch::Device device, std::chrono::milliseconds timeout = std::chrono::minutes(30),
             size_t depth = 2)
      : state_(std::make_shared<State>(device, depth < 1 ? 1 : depth)), timeout_(timeout) {
    thread_ = std::thread([state = state_, &loader] { gather(*state, loader); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
    }
    state_->changed.notify_all();
    if (timed_out_)
      thread_.detach();  // it touches only the shared state when (if) the loader returns
    else
      thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch, its tensors usable on the device; nullopt after the last.
  std::optional<Batch> next() {
    State& s = *state_;
    std::unique_lock<std::mutex> lock(s.mutex);
    if (!s.changed.wait_for(lock, timeout_, [&s] { return !s.queue.empty() || s.done; })) {
      timed_out_ = true;
      throw DataError("the data loader produced no batch within " + std::to_string(timeout_.count() / 1000) +
                      " s; check the dataset (a file on a hung network mount, a worker stuck in a transform)");
    }
    if (s.queue.empty()) {
      if (s.error) std::rethrow_exception(s.error);
      return std::nullopt;
    }
    Item item = std::move(s.queue.front());
    s.queue.pop_front();
    lock.unlock();
    s.changed.notify_all();
    if constexpr (detail::HasDataAndTarget<Batch>::value) s.copy.use({item.batch.data, item.batch.target}, item.ready);
    return std::move(item.batch);
  }

 private:
  struct Item {
    Batch batch;
    std::shared_ptr<void> ready;
  };
  // What the thread and the training loop share; the thread holds it too.
  struct State {
    State(torch::Device device, size_t depth) : copy(device), depth(depth) {}
    detail::DeviceCopy copy;
    size_t depth;
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Item> queue;
    bool stop = false, done = false;
    std::exception_ptr error;
  };

  static void gather(State& s, Loader& loader) {
    try {
      torch::NoGradGuard no_grad;
      // torch::data's iterators fetch in begin() and ++: stop is checked
      // before each fetch, so a loop that stopped early costs no batch more.
      for (auto it = loader.begin(); it != loader.end();) {
        Item item{*it, nullptr};
        if constexpr (detail::HasDataAndTarget<Batch>::value) {
          auto copies = s.copy.start({item.batch.data, item.batch.target}, item.ready);
          item.batch.data = copies[0];
          item.batch.target = copies[1];
        }
        std::unique_lock<std::mutex> lock(s.mutex);
        s.changed.wait(lock, [&s] { return s.queue.size() < s.depth || s.stop; });
        if (s.stop) return;
        s.queue.push_back(std::move(item));
        lock.unlock();
        s.changed.notify_all();
        lock.lock();
        if (s.stop) return;
        lock.unlock();
        ++it;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.done = true;
    }
    s.changed.notify_all();
  }

  std::shared_ptr<State> state_;
  std::chrono::milliseconds timeout_;
  bool timed_out_ = false;
  std::thread thread_;
};

}  // namespace ddp
