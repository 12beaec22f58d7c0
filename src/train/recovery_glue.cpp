#include "train/recovery_glue.h"

#include <chrono>
#include <iostream>
#include <optional>

#include "ddp/train/errors.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/run_dir.h"
#include "train/live_state.h"

namespace ddp::detail {
namespace {

// How long the others wait for the first rank left to save the state.
constexpr std::chrono::minutes kWriterTimeout{30};

TrainState* g_live = nullptr;
struct EpochTrained {
  int64_t epoch, epoch_step, epoch_samples;
};
std::optional<EpochTrained> g_trained;

// The state reform_or_stop saves: the live one, at the end of its epoch's
// steps when those were all taken. "" when there is none (a program without
// resume_or_start), else where it went.
std::string save_live_state() {
  if (!g_live || !g_live->run || !g_live->model || !g_live->optimizer) return "";
  TrainState here = *g_live;
  if (g_trained) {
    here.epoch = here.sampler_epoch = g_trained->epoch;
    here.epoch_step = g_trained->epoch_step;
    here.epoch_samples = g_trained->epoch_samples;
  }
  const std::string path = here.run->checkpoint_path();
  save_checkpoint_alone(path, here);
  return path;
}

// Too few ranks left: the first saves the live state, the others wait for
// it (their launcher would stop it mid-save once they end), then every one
// throws Preempted (exit 75).
[[noreturn]] void stop_too_few(const TooFewRanks& e) {
  std::string kept = "this rank keeps nothing: the first rank left saves the state";
  if (e.writer()) {
    try {
      const std::string path = save_live_state();
      kept = path.empty() ? "no checkpoint: the program did not call resume_or_start"
                          : "the last committed step is saved in " + path + "; resume from it (--resume " + path +
                                ") with enough ranks";
    } catch (const std::exception& save) {
      kept = std::string("saving the last committed step failed: ") + save.what();
    }
    e.saved();
  } else if (!e.wait_for_writer(kWriterTimeout)) {
    kept = "the first rank left did not say within " + std::to_string(kWriterTimeout.count()) +
           " min that it saved the state";
  }
  throw Preempted(std::string(e.what()) + "; " + kept + " (exit " + std::to_string(kPreemptedExitCode) + ")");
}

}  // namespace

bool peer_fault(const ProcessGroup& pg, const std::string& what) {
  try {
    throw;
  } catch (const TooFewRanks& e) {
    stop_too_few(e);
  } catch (const UsageError&) {
    return false;
  } catch (const Preempted&) {
    return false;
  } catch (const NonFiniteLoss&) {
    return false;
  } catch (const DataError&) {
    return false;
  } catch (const CheckpointError&) {
    return false;
  } catch (const StateLost&) {
    return false;
  } catch (const std::exception& e) {
    const std::string text = e.what();
    std::cerr << "rank " << pg.rank() << "/" << pg.size() << ": " << what << " failed ("
              << text.substr(0, text.find('\n')) << "); re-forming the group" << std::endl;
    return true;
  }
}

void reform_or_stop(RecoverableGroup& group) {
  try {
    group.reform();
  } catch (const TooFewRanks& e) {
    stop_too_few(e);
  }
}

void track_live_state(TrainState& state) { g_live = &state; }

void forget_live_state() {
  g_live = nullptr;
  g_trained.reset();
}

void note_epoch_trained(int64_t epoch, int64_t epoch_step, int64_t epoch_samples) {
  g_trained = EpochTrained{epoch, epoch_step, epoch_samples};
}

void forget_epoch_trained() { g_trained.reset(); }

bool run_again(ProcessGroup& pg, const char* what, bool in_catch) {
  auto* group = dynamic_cast<RecoverableGroup*>(&pg);
  if (!group) return false;
  if (group->joining())
    throw UsageError("rank " + std::to_string(group->slot()) + " (launch rank): " + what + " on a recoverable group "
                     "this rank is still joining: call grow() (the kit: resume_or_start) before any collective");
  if (in_catch) {
    if (!peer_fault(pg, what)) return false;
  } else if (group->agree()) {
    return false;
  } else {
    std::cerr << "rank " << pg.rank() << "/" << pg.size() << ": " << what
              << " did not finish on every rank; re-forming the group" << std::endl;
  }
  reform_or_stop(*group);
  return true;
}

}  // namespace ddp::detail
