#include "membership.h"

#include <algorithm>

namespace ddprun {
namespace {

// The entries of `a` that `b` lacks, comma-separated; "none" when there are none.
std::string missing_from(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::string out;
  for (const auto& n : a)
    if (std::find(b.begin(), b.end(), n) == b.end()) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

std::string membership_change(const Assignment& before, const Assignment& after, const std::string& why) {
  std::vector<std::string> old_nodes = before.nodes, new_nodes = after.nodes;
  std::sort(old_nodes.begin(), old_nodes.end());
  std::sort(new_nodes.begin(), new_nodes.end());
  if (old_nodes == new_nodes) return "";
  return "membership changed in round " + std::to_string(after.round) + ": world size " +
         std::to_string(before.world_size) + " -> " + std::to_string(after.world_size) + ", nodes " +
         std::to_string(before.num_nodes) + " -> " + std::to_string(after.num_nodes) + "; joined: " +
         missing_from(after.nodes, before.nodes) + "; left: " + missing_from(before.nodes, after.nodes) +
         "; why: " + why;
}

}  // namespace ddprun
