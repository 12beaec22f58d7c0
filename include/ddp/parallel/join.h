// ddp::Join: training on uneven inputs, where ranks have different numbers of
// batches. A rank that runs out of batches keeps shadowing the collectives of
// the ranks still training (zeros for their gradient all-reduces) until every
// rank is done, then all ranks take the model of the last rank to finish. As
// PyTorch 1.13's torch.distributed.algorithms.join.Join and DDP's join().
//
//   ddp::DistributedDataParallel model(net, pg);
//   ddp::join({&model}, [&] {
//     for (auto& batch : *loader) {          // 5 batches here, 7 on another rank
//       optimizer.zero_grad();
//       torch::mse_loss(model(batch.data), batch.target).backward();
//       optimizer.step();
//     }
//   });                                      // every rank gets here, same model
//
// or as a guard: { ddp::Join join({&model}); for (...) {...} }  // shadows at scope exit
//
// Without it, a rank that finishes early leaves the others' all-reduces
// unanswered: they fail (CommError) saying so, within the process group's
// timeout at worst.
//
// On a recoverable group (ddp/comm/recovery.h) a joined rank votes on each
// step it shadows, as the ranks still training do (should_commit()), and
// re-forms with them when a rank is lost; the final sync is voted on too and
// run again after a fault. No rank joining the group is taken in while Join
// runs. Lost with every rank that finished last, the newest model is gone:
// StateLost.
#pragma once

#include <torch/arg.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddp/parallel/comm_hook.h"
#include "ddp/comm/process_group.h"

namespace ddp {

struct JoinOptions {
  // false: Join does nothing at all (inputs are known to be even).
  TORCH_ARG(bool, enable) = true;
  // Every rank throws an UnevenInputsError as soon as one rank runs out,
  // instead of shadowing: for a program that handles uneven inputs itself.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  // DistributedDataParallel's gradients are divided by the world size (true)
  // or by the number of ranks still training (false), so that a joined rank's
  // zeros do not dilute the average. Ignored with a communication hook, which
  // divides as it likes (PyTorch's allreduce_hook by the world size).
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

// The two moments of Join a participant fills in, as PyTorch's JoinHook.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Once per iteration of the ranks still training, on a rank that has run
  // out: the collectives of one forward, backward and optimizer step.
  virtual void main_hook() {}
  // Once every rank has run out; is_last_joiner: this rank was among the last.
  virtual void post_hook(bool is_last_joiner) { (void)is_last_joiner; }
};

// What Join tells each participant while it is active.
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;  // this one counts the ranks still training
};

// Something with per-iteration collectives that can take part in Join
// (DistributedDataParallel; a sharded optimizer later), as PyTorch's Joinable.
// Before its own collectives of each iteration it calls
// Join::notify_join_context(*this).
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  virtual ProcessGroup& join_process_group() = 0;
  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
};

// RAII: active from construction; its destructor (or finish()) runs the
// shadow loop and the final model sync. A destructor reached by an exception
// does neither (as PyTorch, the exception goes on; the other ranks then fail
// within the timeout), so it never throws during unwinding. It may throw
// otherwise: UnevenInputsError with throw_on_early_termination, CommError.
class Join {
 public:
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // The end of this rank's inputs: shadows the others until every rank is
  // done, then runs the post hooks. Once; the destructor then does nothing.
  void finish();

  // Called by a Joinable before its collectives of each iteration: an
  // all-reduce of ones that counts the ranks still training (its future's
  // value), or an empty future when `joinable` is not Join's first or Join is
  // not active. With throw_on_early_termination it also checks, and throws an
  // UnevenInputsError on every rank once one has run out.
  static CommFuture notify_join_context(Joinable& joinable);

 private:
  void reset_configs();
  // The shadow loop: false once this rank shadowed an iteration.
  void shadow(bool& is_last_joiner);
  int num_nonjoined();
  [[noreturn]] void notify_to_terminate();

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  ProcessGroup* pg_ = nullptr;
  int uncaught_at_start_ = 0;
  bool finished_ = false;
};

// The function form: runs `loop` inside a Join and finishes it.
void join(std::vector<Joinable*> joinables, const std::function<void()>& loop, JoinOptions options = {});

}  // namespace ddp
