// Writing a file so that a reader sees either the whole old version or the
// whole new one, and a crash or a full disk at any moment loses nothing: the
// one writer of checkpoints, state dicts, metrics and logs (train/), the
// timeline (observe/) and main's error file (main_guard.cpp). Torch-free.
// No write follows a symbolic link: a link planted where one of our files
// goes (or its temporary) is an error, never a way to write somewhere else.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

namespace detail {

// Where a write failed: the step ("open <temporary>", "write", "fsync",
// "close", "rename") and its errno. An empty step: nothing failed.
struct FileWriteFailure {
  std::string step;
  int err = 0;
  explicit operator bool() const { return !step.empty(); }
};

// All of data to fd; 0, or the errno of the write that failed (EIO for one
// that wrote nothing).
int write_all(int fd, const char* data, size_t size);

// Writes size bytes to `tmp`, a temporary in the folder of the file it will
// replace: a leftover (or a link) at `tmp` is removed first, then the file
// is created afresh (O_EXCL|O_NOFOLLOW, 0644), written, fsynced and closed.
// On a failure `tmp` is removed again.
FileWriteFailure write_synced_temporary(const std::string& tmp, const char* data, size_t size);
// Renames `tmp` over `path` (a link at `path` itself is replaced, never its
// target), then fsyncs the folder so the rename is durable. On a failure
// `tmp` is removed and `path` is untouched.
FileWriteFailure rename_synced(const std::string& tmp, const std::string& path);

}  // namespace detail

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
