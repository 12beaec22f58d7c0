# What a build spends compiling, and how it spends less (docs/testing.md,
# "Tests and their cost"):
#
# - The LibTorch headers are parsed once per build, not once per file: a
#   precompiled <torch/torch.h> (about 12 of the 21 seconds a file took
#   before) made once for the libraries and programs (the core's PCH) and once
#   for the tests (the same with <gtest/gtest.h>), and shared by every target
#   of that kind. GCC uses a shared PCH only where the position-independence
#   flags agree, so every target that shares one is compiled with -fPIC (the
#   libraries are anyway; an executable's own code pays nothing measurable).
#   Clang refuses a PCH whose command-line macros differ from the file's,
#   and records the checkout's paths in it (ccache could not reuse its
#   users in another clone): builds with clang use no PCH.
# - Unity builds: each target's files are compiled eight at a time as one,
#   so what they share (LibTorch's inline functions and templates, generated
#   at -O3 once per file before) is generated once per batch. A file whose
#   file-local names clash with another's in its batch is compiled alone
#   (SKIP_UNITY_BUILD_INCLUSION, in its folder's CMakeLists.txt). The batch
#   files are ours (ddp_unity_batches), not CMake's: CMake before 3.32 names
#   each file by its absolute path, which no other checkout shares, so ccache
#   missed every batch in a fresh clone; ours name them by relative paths.
# - Code that only tests compile (test files, test workers) is optimized at
#   DDP_TEST_OPTIMIZE (-O1): the arithmetic under test is the library's and
#   LibTorch's, compiled as users get them, while -O3 on test code costs
#   about a fifth of its compile time (amp_test.cpp without a PCH: 21.6 s
#   at -O3, 17.0 s at -O1) and no test runs faster for it.
# - ccache keeps working: deploy/ scripts set the sloppiness a PCH needs.
# - Programs and libraries are linked by LLVM's lld where the compiler can
#   use it (DDP_LINKER=auto): GNU ld took about 1 s of CPU for each program
#   that links LibTorch, lld a tenth of that, and a build links some fifty.
#   ccache does not cache links, so a warm build paid them all each time.
#
# DDP_PCH=OFF DDP_UNITY=OFF compiles every file on its own includes (to
# check that each file includes what it uses and clashes with no other).

option(DDP_PCH "Precompile the LibTorch headers once per build" ON)
option(DDP_UNITY "Compile each target's files in batches (unity builds)" ON)
set(DDP_TEST_OPTIMIZE -O1 CACHE STRING "Optimization of code that only tests compile")
set(CMAKE_UNITY_BUILD ${DDP_UNITY})
set(CMAKE_UNITY_BUILD_BATCH_SIZE 8)
set(DDP_UNITY_EXTENSIONS cpp cc cxx)

# DDP_LINKER: auto (lld where the compiler can link with it, else the
# compiler's default), default, or a name -fuse-ld takes (lld, gold, bfd).
# Only this build's own links: the installed package asks nothing of its users'.
set(DDP_LINKER auto CACHE STRING "The linker: auto, default, or a name for -fuse-ld")
if(DDP_LINKER STREQUAL "auto")
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=lld DDP_HAVE_LLD)
  if(DDP_HAVE_LLD)
    add_link_options(-fuse-ld=lld)
  endif()
elseif(NOT DDP_LINKER STREQUAL "default")
  add_link_options(-fuse-ld=${DDP_LINKER})
endif()

set(DDP_PCH_CORE_HEADERS <torch/torch.h>)
set(DDP_PCH_TEST_HEADERS <torch/torch.h> <gtest/gtest.h>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(DDP_PCH_SHARED ON)
else()
  set(DDP_PCH_SHARED OFF)
endif()

# ddp_precompile(<target> CORE|TEST): <target>'s files start from
# precompiled headers: CORE, the one ddp_core_pch makes (src/CMakeLists.txt)
# with the usage requirements of ddp::ddp alone; TEST, the one ddp_test_pch
# makes (tests/CMakeLists.txt). GCC takes a shared PCH only where every macro
# it was made with is defined alike (a file may define more, if the headers
# never name them), so an anchor carries no macro of its own.
function(ddp_precompile target kind)
  if(NOT DDP_PCH)
    return()
  endif()
  if(NOT DDP_PCH_SHARED)
    # Clang (the sanitized build): a PCH of each target's own, which records
    # the checkout's absolute paths, so ccache could not reuse a file
    # compiled with it in another clone (every warm CI build missed). Without
    # one the sanitized build's cold compile measured 318 s against 299 s,
    # and a warm one hits ccache throughout.
    return()
  endif()
  if(kind STREQUAL "TEST")
    set(anchor ddp_test_pch)
    set(headers ${DDP_PCH_TEST_HEADERS})
    # GoogleTest's macros (GTEST_HAS_PTHREAD) as the shared PCH was made
    # with them, also in the test programs that use none of it (a static
    # library: it adds nothing to a program that calls nothing of it).
    target_link_libraries(${target} PRIVATE GTest::gtest)
  else()
    set(anchor ddp_core_pch)
    set(headers ${DDP_PCH_CORE_HEADERS})
  endif()
  target_compile_options(${target} PRIVATE -fPIC -Winvalid-pch)
  if(target STREQUAL anchor)
    target_precompile_headers(${target} PRIVATE ${headers})
  else()
    target_precompile_headers(${target} REUSE_FROM ${anchor})
  endif()
endfunction()

# ddp_test_program(<target>): a test, or a program only tests run (a rank,
# a worker, a fuzz harness), after its target_link_libraries: its own code at
# DDP_TEST_OPTIMIZE, with the tests' PCH where it uses Torch.
function(ddp_test_program target)
  target_compile_options(${target} PRIVATE ${DDP_TEST_OPTIMIZE})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # A test fixture in an anonymous namespace, seen from another file of
    # its unity batch: GCC warns, though nothing is shared across files.
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
  get_target_property(libs ${target} LINK_LIBRARIES)
  if(libs MATCHES "ddp::(ddp|train)")
    ddp_precompile(${target} TEST)
  endif()
endfunction()

# ddp_targets_under(<source dir> <out var>): every target defined in <source
# dir> and the folders below it.
function(ddp_targets_under dir out)
  get_property(found DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    ddp_targets_under(${sub} more)
    list(APPEND found ${more})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# ddp_unity_batches(<source dir>): after every target is defined (the root
# CMakeLists.txt calls it last), replaces the files of each target under
# <source dir> that has UNITY_BUILD on by batch files of its own,
# CMAKE_UNITY_BUILD_BATCH_SIZE files each, that include them by paths
# relative to the batch file (CMake's own would name absolute paths).
function(ddp_unity_batches dir)
  ddp_targets_under(${dir} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      get_target_property(unity ${target} UNITY_BUILD)
      if(unity)
        get_target_property(target_dir ${target} SOURCE_DIR)
        _ddp_unity_target(${target} ${target_dir})
      endif()
    endif()
  endforeach()
endfunction()

function(_ddp_unity_target target dir)
  get_target_property(sources ${target} SOURCES)
  get_target_property(binary_dir ${target} BINARY_DIR)
  set(out ${binary_dir}/unity)
  string(JOIN "|" extensions ${DDP_UNITY_EXTENSIONS})
  set(kept)
  set(batched)
  foreach(src IN LISTS sources)
    set(skip ON)
    if(NOT src MATCHES "\\$<" AND src MATCHES "\\.(${extensions})$")
      # A relative name would be taken relative to this (the root) folder.
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY ${dir} NORMALIZE OUTPUT_VARIABLE abs)
      get_source_file_property(skip ${abs} DIRECTORY ${dir} SKIP_UNITY_BUILD_INCLUSION)
    endif()
    if(skip)
      list(APPEND kept ${src})
    else()
      list(APPEND batched ${abs})
    endif()
  endforeach()
  list(LENGTH batched count)
  set(start 0)
  set(index 0)
  while(start LESS count)
    list(SUBLIST batched ${start} ${CMAKE_UNITY_BUILD_BATCH_SIZE} files)
    math(EXPR start "${start} + ${CMAKE_UNITY_BUILD_BATCH_SIZE}")
    list(LENGTH files n)
    if(n EQUAL 1)
      list(APPEND kept ${files})
      continue()
    endif()
    set(content "/* ${target}: files compiled as one (cmake/compile_cost.cmake) */\n")
    foreach(file IN LISTS files)
      file(RELATIVE_PATH rel ${out} ${file})
      string(APPEND content "#include \"${rel}\"\n")
    endforeach()
    set(unity_file ${out}/${target}_${index}.cxx)
    file(CONFIGURE OUTPUT ${unity_file} CONTENT "${content}" @ONLY)
    list(APPEND kept ${unity_file})
    math(EXPR index "${index} + 1")
  endwhile()
  set_property(TARGET ${target} PROPERTY SOURCES ${kept})
  set_property(TARGET ${target} PROPERTY UNITY_BUILD OFF)
endfunction()
