# Sourced by deploy/run-tests.sh before the sanitized tests and the fuzzers
# (build-san): the sanitizer runtime options, each with its reason.
#
# UBSan: a report names the call stack (-fno-sanitize-recover=undefined,
# cmake/sanitize.cmake, already makes it fatal).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# ASan: a report is fatal and says where; see below for what else is set.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:halt_on_error=1}
