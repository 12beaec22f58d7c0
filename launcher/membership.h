// The one log line an agent writes when its group's membership changes: the
// old and new world size, which nodes came and which went, and why (the
// round's record: nodes waiting to join, or the failure that restarted it).
#pragma once

#include <string>

#include "rendezvous.h"

namespace ddprun {

// "" when `after` has the same nodes as `before` (a restart of the same group).
std::string membership_change(const Assignment& before, const Assignment& after, const std::string& why);

}  // namespace ddprun
