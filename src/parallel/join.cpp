#include "ddp/parallel/join.h"

#include "ddp/comm/recovery.h"
#include "usage_check.h"

#include <exception>
#include <iostream>

namespace ddp {
namespace {

// A rank that is this many iterations behind is told once that its inputs
// are badly skewed (PyTorch's WARN_THRESHOLD).
constexpr int kSkewWarning = 1000;

at::Tensor scalar(float value, const ProcessGroup& pg) {
  return torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat).device(pg.device()));
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  check_usage(!joinables_.empty(), "ddp::Join needs at least one joinable (the DistributedDataParallel model)");
  for (auto* j : joinables_) {
    check_usage(j != nullptr, "ddp::Join was given a null joinable");
    ProcessGroup* pg = &j->join_process_group();
    if (!pg_) pg_ = pg;
    check_usage(pg == pg_, "rank ", pg_->rank(),
                ": ddp::Join: the joinables use different process groups; Join works over one group");
  }
  if (auto* group = dynamic_cast<RecoverableGroup*>(pg_)) {
    if (group->grow_pending()) group->grow();  // a vote before took ranks in: not inside the Join
    group->set_admit_joining(false);
  }
  for (auto* j : joinables_) hooks_.push_back(j->join_hook(options_));
  bool first = true;
  for (auto* j : joinables_) {
    j->join_config_ = JoinConfig{options_.enable(), options_.throw_on_early_termination(), first};
    first = false;
  }
}

Join::~Join() noexcept(false) {
  if (finished_) return;
  // The loop threw: let that exception go on, without shadowing (PyTorch's
  // `if type: return`). The other ranks fail within their timeout.
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    reset_configs();
    return;
  }
  finish();
}

void Join::reset_configs() {
  for (auto* j : joinables_) j->join_config_ = JoinConfig{};
  if (auto* group = dynamic_cast<RecoverableGroup*>(pg_)) group->set_admit_joining(true);
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  // Outside the loop the joinables go back to plain behaviour (PyTorch leaves
  // them configured; see docs/reducer.md, "Join").
  struct Reset {
    Join* self;
    ~Reset() { self->reset_configs(); }
  } reset{this};
  if (!options_.enable()) return;

  auto* group = dynamic_cast<RecoverableGroup*>(pg_);
  bool is_last_joiner = true;
  for (;;) {
    try {
      shadow(is_last_joiner);
      for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
      if (!group || group->agree()) return;
      throw CommError("rank " + std::to_string(pg_->rank()) + ": ddp::Join: the final sync did not finish on every rank");
    } catch (const UsageError&) {
      throw;
    } catch (const UnevenInputsError&) {
      throw;
    } catch (const StateLost&) {
      throw;
    } catch (const std::exception& e) {
      if (!group) throw;
      const std::string what = e.what();
      std::cerr << "rank " << pg_->rank() << ": ddp::Join: " << what.substr(0, what.find('\n'))
                << "; re-forming the group" << std::endl;
      group->reform();
    }
  }
}

void Join::shadow(bool& is_last_joiner) {
  auto* group = dynamic_cast<RecoverableGroup*>(pg_);
  for (int i = 0;; ++i) {
    if (i == kSkewWarning + 1)
      std::cerr << "rank " << pg_->rank() << ": ddp::Join: this rank has at least " << kSkewWarning
                << " fewer inputs than the ranks still training; a skew this large wastes their time" << std::endl;
    if (num_nonjoined() == 0) return;
    if (options_.throw_on_early_termination()) notify_to_terminate();
    for (auto& hook : hooks_) hook->main_hook();
    // The ranks still training vote on their step: so does this one. Its
    // model is older than theirs once a step it shadowed committed.
    if (group && !group->should_commit())
      throw CommError("rank " + std::to_string(pg_->rank()) + ": ddp::Join: a step it shadowed did not commit");
    is_last_joiner = false;
  }
}

// The joined rank's side of notify_join_context's all-reduce of ones.
int Join::num_nonjoined() {
  auto count = scalar(0, *pg_);
  pg_->allreduce(count).wait();
  return static_cast<int>(count.item<float>());
}

void Join::notify_to_terminate() {
  auto ones = scalar(1, *pg_);
  pg_->allreduce(ones).wait();
  throw UnevenInputsError("rank " + std::to_string(pg_->rank()) + ": ddp::Join: rank " + std::to_string(pg_->rank()) +
                          " exhausted all inputs. throw_on_early_termination is on, so every rank stops here; "
                          "catch ddp::UnevenInputsError to handle the uneven inputs, or turn it off to let Join "
                          "shadow the ranks still training.");
}

CommFuture Join::notify_join_context(Joinable& joinable) {
  const auto& config = joinable.join_config();
  if (!config.enable || !config.is_first_joinable) return CommFuture();
  auto& pg = joinable.join_process_group();
  auto ones = scalar(1, pg);
  CommFuture nonjoined(pg.allreduce(ones), ones);
  if (config.throw_on_early_termination) {
    auto zeros = scalar(0, pg);
    pg.allreduce(zeros).wait();
    if (zeros.item<float>() != 0)
      throw UnevenInputsError("rank " + std::to_string(pg.rank()) +
                              ": ddp::Join: detected at least one rank that exhausted inputs. Throwing across all "
                              "ranks (throw_on_early_termination).");
  }
  return nonjoined;
}

void join(std::vector<Joinable*> joinables, const std::function<void()>& loop, JoinOptions options) {
  Join guard(std::move(joinables), options);
  loop();
  guard.finish();
}

}  // namespace ddp
