// Collectives over bytes, as PyTorch's broadcast_object_list and
// all_gather_object: for what is not a tensor (a model's signature, a
// checkpoint file, a row of the environment table). The bytes travel as uint8
// tensors on the process group's device; lengths may differ across ranks.
#pragma once

#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

// Collective: every rank returns `root`'s bytes (the others' argument is
// ignored). Two broadcasts: the length, then the bytes.
std::string broadcast_object(ProcessGroup& pg, std::string bytes, int root = 0);

// Collective: every rank returns every rank's bytes, in rank order. Two
// all-gathers: the lengths, then the bytes padded to the longest.
std::vector<std::string> all_gather_object(ProcessGroup& pg, const std::string& bytes);

}  // namespace ddp
