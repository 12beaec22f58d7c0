// Files that are either wholly the old version or wholly the new one: what
// checkpoints, state dicts and run-folder files are written with, so that a
// crash or a full disk at any moment loses nothing.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// Writes bytes to path via path.tmp, fsync, rename, fsync of the directory.
// CheckpointError naming the path and the failed step; the previous file, if
// any, is untouched then.
void write_atomically(const std::string& path, const std::vector<char>& bytes);

}  // namespace ddp
