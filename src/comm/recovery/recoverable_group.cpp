// A group that re-forms without its lost ranks (ddp/comm/recovery.h).
//
// Every agreement goes through the launcher's store, which outlives any
// worker: a step commits when every rank of the generation added itself to
// the step's count, and the first decision written ("commit" or "abort") is
// the one every rank reads. A fault (a rank's failed step, a worker lost) is
// seen by each rank's FaultWatch (fault_watch.h), which shuts the inner
// group's sockets down, so no rank stays blocked in a collective with a dead
// peer. Re-forming, each rank marks its arrival in the next generation and
// waits until every member of the last one arrived, was reported lost, or the
// deadline passed; the first member list written is the next generation.
#include "ddp/comm/recovery.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <torch/cuda.h>

#include "comm/backend/connect.h"
#include "comm/c10d_compat.h"
#include "comm/group/registry.h"
#include "comm/objects/object_exchange.h"
#include "comm/recovery/fault_watch.h"
#include "comm/recovery/recovery_keys.h"
#include "comm/store/store_client.h"
#include "comm/store/store_deadline.h"
#include "comm/work_handle.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
// The longest pause between two looks at a vote or an arrival.
constexpr auto kLook = std::chrono::milliseconds(50);
// Consecutive failures of a step with no rank lost: the error is the
// program's own (a bug, not a peer), and run_step rethrows it.
constexpr int kFailuresWithoutLoss = 3;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The connections among `fds`, not the listening sockets: Gloo's (2.x) event
// loop treats a failed accept() on its listener as fatal, and a shut-down
// connection as the peer's failure, which ends the collective.
std::vector<int> connected_sockets(const std::vector<int>& fds) {
  std::vector<int> out;
  for (int fd : fds) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && !listening) out.push_back(fd);
  }
  return out;
}
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::vector<int> split(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

// NCCL's error handling that aborts the communicators and leaves the
// process running (2.x: CleanUpOnly), not the default that ends it: the
// group re-forms instead.
void keep_process_on_nccl_errors() {
  const char* was = std::getenv(compat::kNcclAsyncErrorHandling);
  if (was && std::string(was) != "2")
    std::cerr << "libddp: " << compat::kNcclAsyncErrorHandling << "=" << was << " set to 2 for in-process recovery "
              << "(abort NCCL's communicators on an error, keep the process)" << std::endl;
  ::setenv(compat::kNcclAsyncErrorHandling, "2", 1);
}

int int_from_environment(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

int round_from_environment() {
  for (const char* name : {"DDPRUN_RDZV_ROUND", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

// Polls `ready` with growing pauses (1 ms up to kLook) until it holds or
// `until`; whether it held.
template <class F>
bool poll_until(Clock::time_point until, F&& ready) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (ready()) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, kLook);
  }
}

class Recoverable final : public RecoverableGroup {
 public:
  Recoverable(const LaunchEnv& env, const RecoveryOptions& options, std::string backend)
      : env_(env), options_(options), round_(round_from_environment()),
        slot_(env.rank),
        node_(int_from_environment("GROUP_RANK", env.rank / std::max(1, env.local_world_size))),
        min_nodes_(options.min_nodes > 0 ? options.min_nodes : int_from_environment("DDPRUN_MIN_NODES", 1)),
        rank_(env.rank),
        backend_(std::move(backend)),
        device_(backend_ == "nccl" ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                                    env.local_rank % std::max<int64_t>(1, torch::cuda::device_count())))
                                   : torch::Device(torch::kCPU)) {
    if (backend_ == "nccl") keep_process_on_nccl_errors();
    store_ = connect_store();
    watch_ = std::make_unique<detail::FaultWatch>(connect_store(), round_, slot_, options_.deadline,
                                                  [this] { abort_sockets(); });
    // Started in place of a lost worker (ddprun sets DDPRUN_REPLACEMENT): it
    // waits to be taken in (grow()), and says so.
    const char* replacement = std::getenv("DDPRUN_REPLACEMENT");
    joining_ = replacement && std::string(replacement) == "1";
    position_->rank = rank_;
    position_->size = env.world_size;
    if (joining_) {
      store_->set(joining_key(slot_), bytes(std::to_string(::getpid())));
      return;
    }
    members_.resize(static_cast<size_t>(env.world_size));
    for (int r = 0; r < env.world_size; ++r) members_[static_cast<size_t>(r)] = r;
    form_inner();
  }

  ~Recoverable() override { watch_->stop(); }

  // ---- ProcessGroup: the current generation's inner group
  int rank() const override { return rank_; }
  int size() const override { return joining_ ? env_.world_size : static_cast<int>(members_.size()); }
  std::string backend_name() const override { return backend_; }
  torch::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return options_.deadline; }
  Work allreduce(at::Tensor& t) override { return inner()->allreduce(t); }
  Work broadcast(at::Tensor& t, int root) override { return inner()->broadcast(t, root); }
  std::vector<at::Tensor> allgather(const at::Tensor& t) override { return inner()->allgather(t); }
  void barrier() override { inner()->barrier(); }
  std::shared_ptr<StoreHandle> store() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_ ? inner_->store() : nullptr;  // none while re-forming or joining
  }
  Work collective(const CollectiveCall& call) override { return inner()->collective(call); }
  std::vector<Work> coalesced(const std::vector<CollectiveCall>& calls) override { return inner()->coalesced(calls); }
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>&, std::chrono::milliseconds) override {
    throw UsageError(who() + "new_group on a recoverable group: its subgroups would not re-form with it; make "
                     "groups beside it only without in-process recovery");
  }
  void shutdown() override {
    watch_->stop();
    std::shared_ptr<ProcessGroup> g;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      g = inner_;
    }
    if (g) g->shutdown();
  }

  // ---- RecoverableGroup
  bool joining() const override { return joining_; }
  bool grow_pending() const override { return joining_ || grow_pending_; }
  void set_state(std::function<std::string()> save, std::function<void(const std::string&)> load) override {
    save_ = std::move(save);
    load_ = std::move(load);
  }

  void grow() override {
    if (!grow_pending()) return;
    int g = -1;
    try {
      g = joining_ ? wait_to_be_taken_in() : generation_ + 1;
      const std::string key = recovery_keys::generation(round_, g);
      // The joining ranks connect only once the members are here, however
      // long the members took between their vote and this step.
      if (!joining_) store_->set(key + "growing", bytes("1"));
      std::vector<int> members;
      poll_until(Clock::now() + options_.deadline, [&] { return store_->check({key + "members"}); });
      members = split(text(store_->get(key + "members")));
      const auto joined = split(text(store_->get(key + "joined")));
      const auto me = std::find(members.begin(), members.end(), slot_);
      if (me == members.end()) throw CommError(who() + "generation " + std::to_string(g) + " left this rank out");
      generation_ = g;
      members_ = members;
      rank_ = static_cast<int>(me - members.begin());
      // Its predecessor's lost/ key goes before the others watch the new
      // generation (they would count it lost again).
      if (joining_) store_->deleteKey(recovery_keys::lost(round_, slot_));
      form_inner();
      hand_over_state(joined);
      if (joining_) store_->deleteKey(joining_key(slot_));
      joining_ = grow_pending_ = false;
      std::cerr << who() << "grew to launch ranks " << join(members_) << " (" << join(joined) << " joined)"
                << std::endl;
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      if (joining_ || excluded_) throw CommError(who() + "could not join the running group: " + first_line(e.what()));
      grow_pending_ = generation_ + 1 == g;  // not yet in generation g: reform() skips its number
      std::cerr << who() << "growing failed (" << first_line(e.what()) << "); re-forming" << std::endl;
      reform();
      return;
    }
    // As in reform(): a CommError re-forms, any other error ends grow().
    try {
      regroup_followers();
    } catch (const CommError& e) {
      std::cerr << who() << "bringing what follows the group in line failed (" << first_line(e.what())
                << "); re-forming" << std::endl;
      reform();
    }
  }

  int generation() const override { return generation_; }
  int slot() const override { return slot_; }
  int node() const override { return node_; }
  std::vector<int> members() const override { return members_; }
  std::shared_ptr<const GroupPosition> position() const override { return position_; }

  bool should_commit() override { return vote(admit_joining_); }
  void set_admit_joining(bool admit) override { admit_joining_ = admit; }
  bool admit_joining() const override { return admit_joining_; }
  bool agree() override { return vote(false); }

  void reform() override {
    if (++reforms_without_loss_ > kFailuresWithoutLoss)
      throw CommError(who() + "the step failed " + std::to_string(kFailuresWithoutLoss) + " times in a row with every "
                      "rank still there: the failure is the program's own, not a lost peer (see the errors above)");
    const auto give_up = Clock::now() + 3 * options_.deadline;
    // A vote took joining ranks in and the group failed before it grew: the
    // next generation's number is the grown one's, which never formed.
    int skip = grow_pending_ ? 1 : 0;
    grow_pending_ = false;
    for (;;) {
      try {
        watch_->pause();
        store_->add(recovery_keys::faults(round_, generation_), 1);  // the others abort too
        abort_inner();
        meet(generation_ + 1 + skip);
        skip = 0;
        form_inner();
      } catch (const UsageError&) {
        throw;
      } catch (const CommError& e) {
        if (excluded_ || Clock::now() >= give_up) throw;  // TooFewRanks is excluded_
        std::cerr << who() << "re-forming failed (" << first_line(e.what()) << "); trying again" << std::endl;
        continue;
      } catch (const std::exception& e) {  // the store's own errors (a timeout)
        if (Clock::now() >= give_up)
          throw CommError(who() + "could not re-form the group: " + first_line(e.what()));
        std::cerr << who() << "re-forming failed (" << first_line(e.what()) << "); trying again" << std::endl;
        continue;
      }
      try {
        regroup_followers();  // its other errors end reform()
        return;
      } catch (const CommError& e) {
        if (Clock::now() >= give_up) throw;
        std::cerr << who() << "bringing what follows the group in line failed (" << first_line(e.what())
                  << "); re-forming again" << std::endl;
      }
    }
  }

  std::shared_ptr<void> on_regroup(std::function<void()> fn) override {
    auto handle = std::make_shared<std::function<void()>>(std::move(fn));
    followers_.push_back(handle);
    return handle;
  }

 private:
  std::string who() const {
    return "rank " + std::to_string(rank_) + "/" + std::to_string(size()) + " (launch rank " + std::to_string(slot_) +
           ", generation " + std::to_string(generation_) + "): ";
  }
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  c10::intrusive_ptr<c10d::Store> connect_store() const {
    try {
      return store_client::connect_bounded(
          env_.master_addr, compat::tcp_store_options(env_.master_port, false, env_.world_size, options_.deadline));
    } catch (const std::exception& e) {
      throw CommError("rank " + std::to_string(env_.rank) + ": init_recoverable_group: cannot reach the launcher's "
                      "store at " + env_.master_addr + ":" + std::to_string(env_.master_port) + ": " +
                      first_line(e.what()));
    }
  }

  std::shared_ptr<ProcessGroup> inner() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!inner_) throw CommError(who() + "the group is re-forming after a fault; call reform() before using it");
    return inner_;
  }

  // The vote of should_commit() (admit: joining ranks may be taken in) and
  // agree() (never): each rank adds itself to the count, the last one
  // decides, and a rank that waited the deadline in vain decides "abort".
  bool vote(bool admit) {
    const std::string step =
        recovery_keys::generation(round_, generation_) + "step/" + std::to_string(step_++) + "/";
    const std::string decision = step + "decision";
    try {
      // On a GPU the step's reduction must be complete on this rank before
      // it says so: a communicator aborted later would leave partial sums.
      if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
      if (aborted_) decide(decision, "abort");  // this generation is broken already
      else if (store_->add(step + "done", 1) == size()) decide_commit(decision, admit);
      const auto until = Clock::now() + options_.deadline;
      const bool decided = poll_until(until, [&] { return store_->check({decision}) || aborted_.load(); });
      if (!decided || !store_->check({decision})) decide(decision, "abort");
      const std::string verdict = text(store_->get(decision));
      if (admit) grow_pending_ = verdict == "grow";  // committed, and the next step takes joining ranks in
      const bool commit = verdict == "commit" || verdict == "grow";
      if (commit) reforms_without_loss_ = 0;  // the failures before were not the program's
      return commit;
    } catch (const std::exception& e) {
      throw CommError(who() + "in-process recovery lost the launcher's store while the ranks voted on step " +
                      std::to_string(step_ - 1) + ": " + first_line(e.what()) +
                      "; the store lives in ddprun (of node 0): it has stopped or its host is unreachable");
    }
  }

  void decide(const std::string& key, const std::string& what) { store_->compareSet(key, {}, bytes(what)); }
  std::string joining_key(int slot) const { return recovery_keys::joining(round_, slot); }

  // The last rank to vote: "commit", or (admit) "grow" when ranks wait to
  // join (the step commits, and the next generation is this one's and theirs).
  void decide_commit(const std::string& decision, bool admit) {
    std::vector<int> joiners;
    for (int s = 0; admit && s < env_.world_size; ++s)
      if (std::find(members_.begin(), members_.end(), s) == members_.end() && store_->check({joining_key(s)}))
        joiners.push_back(s);
    if (joiners.empty()) return decide(decision, "commit");
    if (text(store_->compareSet(decision, {}, bytes("grow"))) != "grow") return;
    std::vector<int> grown = members_;
    grown.insert(grown.end(), joiners.begin(), joiners.end());
    std::sort(grown.begin(), grown.end());
    const std::string key = recovery_keys::generation(round_, generation_ + 1);
    store_->set(key + "joined", bytes(join(joiners)));
    store_->compareSet(key + "members", {}, bytes(join(grown)));
    store_->set(recovery_keys::root(round_) + "grown", bytes(std::to_string(generation_ + 1)));
  }

  // A joining rank: the generation that takes it in, once the others began
  // to grow into it (a later one, if they re-formed before they could).
  int wait_to_be_taken_in() {
    const std::string grown = recovery_keys::root(round_) + "grown";
    int taken = -1;
    const bool in = poll_until(Clock::now() + options_.join_timeout, [&] {
      if (!store_->check({grown})) return false;
      const int g = std::stoi(text(store_->get(grown)));
      const std::string key = recovery_keys::generation(round_, g);
      const auto members = split(text(store_->get(key + "members")));
      if (std::find(members.begin(), members.end(), slot_) == members.end()) return false;
      if (!store_->check({key + "growing"})) return false;
      taken = g;
      return true;
    });
    if (!in)
      throw CommError(who() + "was not taken into the running group within " +
                      std::to_string(options_.join_timeout.count() / 1000) + " s (RecoveryOptions::join_timeout)");
    return taken;
  }

  // Runs the on_regroup() functions still held, in the order registered.
  void regroup_followers() {
    followers_.erase(std::remove_if(followers_.begin(), followers_.end(), [](const auto& f) { return f.expired(); }),
                     followers_.end());
    for (const auto& weak : followers_)
      if (auto fn = weak.lock()) (*fn)();
  }

  // The first rank that was in the group before sends the state; the ranks
  // that joined take it.
  void hand_over_state(const std::vector<int>& joined) {
    auto is_new = [&](int s) { return std::find(joined.begin(), joined.end(), s) != joined.end(); };
    int root = 0;
    while (root < size() && is_new(members_[static_cast<size_t>(root)])) ++root;
    if (root == size()) throw CommError(who() + "no rank of the group was in it before; nothing to hand over");
    std::string state = rank_ == root && save_ ? save_() : std::string();
    state = detail::broadcast_bytes(*this, std::move(state), root);
    if (joining_) {
      if (!load_) throw UsageError(who() + "joined a running group without set_state(): its state cannot be taken");
      load_(state);
    }
  }

  // The inner group of this generation: Gloo on the launcher's store, under
  // the generation's prefix; its sockets noted so that abort_inner() can end
  // any collective blocked on them.
  void form_inner() {
    detail::BackendRequest request;
    request.backend = backend_;
    request.asked = options_.backend;
    request.env = env_;
    request.env.rank = rank_;
    request.env.world_size = size();
    request.env.job_id = "recovery_" + std::to_string(round_);
    request.timeout = options_.deadline;
    request.generation = generation_;
    request.store = std::make_shared<StoreHandle>(store_);
    request.who = who();
    const auto before = store_deadline::sockets_now();
    auto made = detail::connect_backend(std::move(request));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device_ = made->device();
      inner_ = std::move(made);
      // NCCL's own connections are its communicator's, which abort() ends.
      sockets_ = backend_ == "gloo" ? connected_sockets(store_deadline::opened_since(before)) : std::vector<int>{};
      aborted_ = false;
    }
    step_ = 0;
    position_->generation = generation_;
    position_->rank = rank_;
    position_->size = size();
    watch_->watch(generation_, members_);
  }

  // From the FaultWatch's thread too: every collective blocked on the inner
  // group fails at once (Gloo: its connections shut down; NCCL: its
  // communicators aborted).
  void abort_sockets() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (inner_ && !aborted_ && backend_ == "nccl") inner_->abort();
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    sockets_.clear();
    aborted_ = true;
  }

  void abort_inner() {
    abort_sockets();
    std::shared_ptr<ProcessGroup> old;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      old = std::move(inner_);
    }
    old.reset();  // its collectives have failed on the shut sockets; the backend ends
  }

  // Generation g: this rank arrives, waits for the last generation's members
  // (arrived, reported lost, or the deadline), and reads the member list
  // the first rank to get there wrote.
  void meet(int g) {
    const std::string key = recovery_keys::generation(round_, g);
    auto arrival = [&](int s) { return key + "arrived/" + std::to_string(s); };
    store_->set(arrival(slot_), bytes(std::to_string(node_)));  // the node it runs on
    auto arrived = [&](int s) { return store_->check({arrival(s)}); };
    auto lost = [&](int s) { return store_->check({recovery_keys::lost(round_, s)}); };
    poll_until(Clock::now() + options_.deadline, [&] {
      for (int s : members_)
        if (s != slot_ && !arrived(s) && !lost(s)) return false;
      return true;
    });
    std::vector<int> proposal;
    for (int s : members_)
      if (s == slot_ || arrived(s)) proposal.push_back(s);
    const auto decided = split(text(store_->compareSet(key + "members", {}, bytes(join(proposal)))));
    const auto me = std::find(decided.begin(), decided.end(), slot_);
    if (decided.size() < members_.size()) reforms_without_loss_ = 0;
    if (me == decided.end()) {
      excluded_ = true;
      throw CommError(who() + "came to generation " + std::to_string(g) + " after the others had formed it without "
                      "this rank (" + join(decided) + "); it took longer than the deadline to notice the fault");
    }
    std::set<std::string> nodes;
    for (int s : decided)
      if (arrived(s)) nodes.insert(text(store_->get(arrival(s))));
    if (static_cast<int>(decided.size()) < options_.min_world_size || static_cast<int>(nodes.size()) < min_nodes_) {
      excluded_ = true;
      throw TooFewRanks(who() + "only " + std::to_string(decided.size()) + " ranks on " +
                            std::to_string(nodes.size()) + " nodes remain (launch ranks " + join(decided) +
                            "), fewer than the minimum of " + std::to_string(options_.min_world_size) + " ranks on " +
                            std::to_string(min_nodes_) + " nodes (--nnodes MIN, RecoveryOptions); the group ends",
                        slot_ == decided.front(), [store = store_, key] { store->set(key + "saved", bytes("1")); },
                        [store = store_, key](std::chrono::milliseconds timeout) {
                          return poll_until(Clock::now() + timeout, [&] { return store->check({key + "saved"}); });
                        });
    }
    generation_ = g;
    members_ = decided;
    rank_ = static_cast<int>(me - decided.begin());
    std::cerr << who() << "re-formed with launch ranks " << join(members_) << std::endl;
  }

  const LaunchEnv env_;
  const RecoveryOptions options_;
  const int round_;
  const int slot_;
  const int node_;       // GROUP_RANK: the launcher's node
  const int min_nodes_;  // RecoveryOptions::min_nodes, resolved
  c10::intrusive_ptr<c10d::Store> store_;  // votes and meetings (main thread)
  std::unique_ptr<detail::FaultWatch> watch_;
  std::vector<int> members_;
  int rank_ = 0;
  const std::string backend_;  // gloo or nccl
  torch::Device device_;       // the inner group's
  int generation_ = 0;
  int64_t step_ = 0;
  bool excluded_ = false;
  bool joining_ = false;       // started in place of a lost rank, not yet taken in
  bool grow_pending_ = false;  // the last vote took joining ranks in
  bool admit_joining_ = true;  // set_admit_joining()
  std::function<std::string()> save_;
  std::function<void(const std::string&)> load_;
  std::vector<std::weak_ptr<std::function<void()>>> followers_;  // on_regroup()
  int reforms_without_loss_ = 0;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<GroupPosition> position_ = std::make_shared<GroupPosition>();
  mutable std::mutex mutex_;  // inner_ and sockets_
  std::shared_ptr<ProcessGroup> inner_;
  std::vector<int> sockets_;
};

}  // namespace

bool recovery_launched() {
  const char* v = std::getenv("DDPRUN_RECOVER_IN_PROCESS");
  return v && std::string(v) == "1";
}

bool RecoverableGroup::run_step(const std::function<void()>& fn) {
  try {
    if (grow_pending()) grow();
    fn();
  } catch (const UsageError&) {
    throw;
  } catch (const UnevenInputsError&) {  // ddp::Join's decision, on every rank
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << "rank " << rank() << "/" << size() << " (launch rank " << slot() << "): the step failed ("
              << what.substr(0, what.find('\n')) << "); re-forming the group" << std::endl;
    reform();
    return false;
  }
  if (should_commit()) return true;
  reform();
  return false;
}

std::shared_ptr<RecoverableGroup> init_recoverable_group(const RecoveryOptions& options) {
  const LaunchEnv env = LaunchEnv::from_environment();
  const std::string who = "rank " + std::to_string(env.rank) + ": init_recoverable_group: ";
  if (!recovery_launched())
    throw UsageError(who + "this process was not launched for in-process recovery; start it with "
                     "ddprun --recover-in-process, whose store outlives any worker");
  if (options.deadline.count() <= 0) throw UsageError(who + "RecoveryOptions::deadline must be positive");
  if (options.min_world_size < 1) throw UsageError(who + "RecoveryOptions::min_world_size must be at least 1");
  const std::string backend = detail::resolve_backend(detail::parse_backend_name(options.backend, true, who));
  if (backend == "mpi")
    throw UsageError(who + "in-process recovery re-forms Gloo and NCCL groups, not MPI's (an MPI job cannot lose a "
                     "process and go on); set RecoveryOptions::backend to \"gloo\" or \"nccl\"");
  auto group = std::make_shared<Recoverable>(env, options, backend);
  detail::GroupRegistry::instance().adopt_default(group, env);
  return group;
}

}  // namespace ddp
