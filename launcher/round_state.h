// The store rendezvous's one round state: the round's number and this
// node's place in it, every key the run writes in the store (the run's own
// and each round's; docs/launcher.md lists them), and how the values under
// them read. No other code of the rendezvous spells a key.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>
#include <vector>

#include "errors.h"

namespace ddprun {

class RoundState {
 public:
  // `where`: the store's "host:port", for messages.
  RoundState(std::string run_id, std::string where);

  // The run's keys. run_id: which run the store serves (the first key any
  // node writes); settings: what every node must share; round: the round
  // under way, which late nodes join.
  static std::string run_id_key() { return "ddprun/run_id"; }
  std::string settings_key() const { return base_ + "settings"; }
  std::string round_key() const { return base_ + "round"; }

  // This round's keys. joined: arrivals so far (c10d); closed: the group's
  // final size (c10d); waiting: nodes that came after it closed (c10d);
  // node/<i>: node i's line (node_line); master: the workers' "ADDRESS
  // PORT"; failed: the round's end (RoundEnd); alive/<i>: node i's
  // keep-alive count; done: nodes whose workers all succeeded; left: nodes
  // that know the outcome; finished: workers that succeeded, over every
  // node (--recover-in-process, where a node may lose them all); vacant/<i>:
  // kVacant once node i was lost under --recover-in-process, then the line
  // of the node that took its place (c10d).
  std::string joined() const { return key("joined"); }
  std::string closed() const { return key("closed"); }
  std::string waiting() const { return key("waiting"); }
  std::string node(int i) const { return key("node/" + std::to_string(i)); }
  std::string master() const { return key("master"); }
  std::string failed() const { return key("failed"); }
  std::string alive(int i) const { return key("alive/" + std::to_string(i)); }
  std::string done() const { return key("done"); }
  std::string left() const { return key("left"); }
  std::string finished() const { return key("finished"); }
  std::string vacant(int i) const { return key("vacant/" + std::to_string(i)); }
  static constexpr const char* kVacant = "lost";

  // Takes round `round`, or the later one the run is in already (a node
  // arriving while the others restart joins their round), and records it.
  void enter(c10d::TCPStore& store, int round);
  int number() const { return number_; }
  // A waiting node was admitted into a later round.
  void move_to(int round) { number_ = round; }

  // This node's place in the round's group, once it has joined.
  int rank = 0;
  int size = 1;
  // This node took a lost node's place in the running round
  // (--recover-in-process): its workers join the others as replacements.
  bool replacing = false;
  std::vector<std::string> hosts;  // by node rank, for messages

  // The line a node writes under node/<i>: its worker count, host, ddprun's
  // pid and a nonce (what tells two ddprun of one host and pid apart).
  static std::string node_line(int nproc);
  static std::string host_in(const std::string& line);
  static std::string pid_in(const std::string& line);

  // Values under the keys are ddprun's own: a whole number of [lo, hi], or
  // foreign_value.
  int number_in(const std::string& key, const std::string& value, long long lo, long long hi) const;
  int stored_number(c10d::TCPStore& store, const std::string& key, long long lo, long long hi) const;
  // Another program (or another ddprun version) shares this store and run id.
  LaunchError foreign_value(const std::string& key, const std::string& value, const std::string& expected) const;

  const std::string& run_id() const { return run_id_; }
  const std::string& where() const { return where_; }

 private:
  std::string key(const std::string& k) const { return base_ + "r" + std::to_string(number_) + "/" + k; }

  std::string run_id_;
  std::string where_;
  std::string base_;  // "ddprun/<run-id>/"
  int number_ = 0;
};

// Store values as bytes and back.
std::vector<uint8_t> store_bytes(const std::string& s);
std::string store_text(const std::vector<uint8_t>& v);

}  // namespace ddprun
