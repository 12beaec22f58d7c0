// Bytes between the ranks of a process group: what the object collectives
// (ddp/comm/object_collectives.h) send once a value is encoded, and what
// the library itself exchanges that is not a tensor (a model's signature, a
// checkpoint's bytes, a row of the environment table, timeline events). The
// lengths travel first, then the bytes as uint8 tensors on the group's
// device; lengths may differ across ranks.
#pragma once

#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::detail {

// Collective: every rank returns `root`'s bytes (the others' argument is
// ignored). Two broadcasts: the length, then the bytes.
std::string broadcast_bytes(ProcessGroup& pg, std::string bytes, int root = 0);

// Collective: `root`'s flag on every rank (one broadcast).
bool broadcast_flag(ProcessGroup& pg, bool flag, int root = 0);

// Collective: whether any rank's flag is set (one all-reduce).
bool any_rank(ProcessGroup& pg, bool flag);

// Collective: every rank returns every rank's bytes, in rank order. Two
// all-gathers: the lengths, then the bytes padded to the longest.
std::vector<std::string> all_gather_bytes(ProcessGroup& pg, const std::string& bytes);

// Collective: `root` returns every rank's bytes in rank order, the others
// nothing. An all-gather of the lengths, then a gather.
std::vector<std::string> gather_bytes(ProcessGroup& pg, const std::string& bytes, int root);

// Collective: rank r returns `parts[r]`, which `root` gives (one per rank;
// ignored elsewhere). A broadcast of the lengths, then a scatter. Where
// `root` calls refuse_scatter instead, the others throw a UsageError naming it.
std::string scatter_bytes(ProcessGroup& pg, const std::vector<std::string>& parts, int root);
void refuse_scatter(ProcessGroup& pg, int root);

}  // namespace ddp::detail
