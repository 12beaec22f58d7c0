// Writing the files of a run folder: checkpoints, state dicts, metrics and
// logs. A file is either wholly the old version or wholly the new one, so
// that a crash or a full disk at any moment loses nothing, and no write
// follows a symbolic link: a link planted where one of our files goes (or its
// temporary) is an error, never a way to write somewhere else.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// Writes bytes to path via path.tmp (created afresh, O_EXCL|O_NOFOLLOW),
// fsync, rename, fsync of the directory. CheckpointError naming the path and
// the failed step; the previous file, if any, is untouched then. The rename
// replaces a link at `path` itself, never its target.
void write_atomically(const std::string& path, const std::vector<char>& bytes);
// The same in two steps, for a writer that checks the new file before it
// replaces the old: write_temporary returns path.tmp, fsynced;
// replace_with_temporary renames it over path and syncs the directory.
std::string write_temporary(const std::string& path, const std::vector<char>& bytes);
void replace_with_temporary(const std::string& path);

// Appends text to path, creating it (0644) if needed; never through a link.
// CheckpointError naming the path if it cannot.
void append_no_follow(const std::string& path, const std::string& text);
// A descriptor open for appending to path (O_APPEND|O_CREAT|O_NOFOLLOW), or
// CheckpointError naming it.
int open_append_no_follow(const std::string& path);

}  // namespace ddp
