# DDP_SANITIZE: every target of this build with AddressSanitizer and
# UndefinedBehaviorSanitizer (the CI's build-san, see deploy/run-tests.sh).
# DDP_FUZZ adds libFuzzer's coverage instrumentation to the same code, so one
# build directory gives both the sanitized tests and the fuzz harnesses.
#
# LibTorch itself is not instrumented (Debian's, built with g++); what it
# allocates and frees on its own is invisible to ASan, which is fine, and
# what crosses between it and us is checked on our side.
if(DDP_SANITIZE)
  set(DDP_SANITIZE_FLAGS
    -fsanitize=address,undefined
    # UB fails the test instead of printing and going on.
    -fno-sanitize-recover=undefined
    # vptr checks the dynamic type behind virtual calls and downcasts
    # against type info that only instrumented code carries: objects that
    # LibTorch (g++, no -fsanitize=vptr) creates, such as autograd nodes
    # and modules' internals, cannot be checked and give false reports.
    # The rest of UBSan stays on.
    -fno-sanitize=vptr
    -fno-omit-frame-pointer)
  # -O1, as ASan's own documentation suggests, and line tables (with inlined
  # frames), which are what a report's file:line needs: -O2 with full debug
  # info of LibTorch's templates made this build the slowest of the three.
  set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -gline-tables-only -DNDEBUG")
  add_compile_options(${DDP_SANITIZE_FLAGS} -gline-tables-only)
  add_link_options(${DDP_SANITIZE_FLAGS})
  # What every sanitized test runs with (tests/, fuzz/): LibTorch's own
  # leaks suppressed (cmake/lsan_suppressions.txt says which and why).
  set(DDP_SANITIZER_TEST_ENV
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/cmake/lsan_suppressions.txt:print_suppressions=0")
  message(STATUS "libddp: built with AddressSanitizer and UndefinedBehaviorSanitizer")
endif()

if(DDP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DDP_FUZZ needs clang's libFuzzer: configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "(Debian: apt-get install clang libclang-rt-14-dev)")
  endif()
  # Coverage for libFuzzer in the library's readers; the harnesses link
  # libFuzzer itself (-fsanitize=fuzzer, fuzz/CMakeLists.txt).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
