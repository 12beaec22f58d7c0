// What every function of ddp::dist (dist.cpp, object_collectives.cpp) says
// the same way: the prefix of its errors, PyTorch's warning for a call on a
// group this rank is not in, and a global rank's place in a group. Private to the core.
#pragma once

#include <string>

#include "ddp/comm/dist.h"

namespace ddp::detail {

// "rank 3: dist.<op>: ", the global rank (-1 before init_process_group).
std::string dist_who(const char* op);

// PyTorch's note for a collective on a group this rank is not in, once per op.
void dist_warn_not_in_group(const char* op);

// `global`'s rank in `group`, or -1 where this rank is not in it (nothing
// runs then); a UsageError naming `op`, `what` ("src", "dst") and the
// group's global ranks where `global` is not one of them.
int dist_root_of(const dist::Group& group, int global, const char* op, const char* what);

}  // namespace ddp::detail
