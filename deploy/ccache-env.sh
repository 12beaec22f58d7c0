# Sourced by the build scripts: ccache's settings for every build of the tree.
# - One cache for all checkouts: paths under the checkout hash as relative
#   ones, so a fresh clone elsewhere (CI) or a git worktree hits the same
#   entries.
# - Precompiled headers (cmake/compile_cost.cmake): ccache caches a file
#   compiled with a PCH only with this sloppiness (the PCH's own macros and
#   its fresh mtime); the PCH's content is still hashed, so a changed header
#   list or LibTorch misses as it should.
# - The inode cache: a header's hash is kept by its inode, size and times,
#   so LibTorch's thousands of headers are not read and hashed again for
#   every file that includes them; a hit cost 0.4 s of CPU without it, 0.15 s
#   with it (a build of the tree: 73 hits, 29 s of ccache's CPU, then 11 s).
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_INODECACHE=${CCACHE_INODECACHE:-true}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
