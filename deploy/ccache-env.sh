# Sourced by the build scripts: ccache's settings for every build of the tree.
# - One cache for all checkouts: paths under the checkout hash as relative
#   ones, so a fresh clone elsewhere (CI) or a git worktree hits the same
#   entries.
# - Precompiled headers (cmake/compile_cost.cmake): ccache caches a file
#   compiled with a PCH only with this sloppiness (the PCH's own macros and
#   its fresh mtime); the PCH's content is still hashed, so a changed header
#   list or LibTorch misses as it should.
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
