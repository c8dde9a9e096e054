#!/usr/bin/env bash
# Builds dfp with AddressSanitizer + UndefinedBehaviorSanitizer into ./build-asan (the library, the
# program and the default test suite; not the benchmarks) and runs the default suite there (ctest
# label "long" excluded) but for its avx2_only: reruns: those replay whole suites with oneDNN limited to
# AVX2, a check of the code's CPU assumptions that the normal build makes, while dfp's avx2 kernels
# run instrumented here in the isa_avx2: runs. Any sanitizer report fails the test it occurs in.
# Extra arguments go to CMake's configure step. See docs/design/testing.md for what is instrumented.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
# -O1, as the sanitizers' documentation advises: at -O3 the instrumented kernel units take
# several times as long to compile and the whole build more than twice as long, for a suite that
# runs no faster (docs/measurements.md, session 50); the checks are the same.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
  -DDFP_SANITIZE=address,undefined -DDFP_BUILD_BENCH=OFF "$@" >/dev/null
start=$(date +%s)
cmake --build build-asan -j"$(nproc)"
echo "sanitize.sh: build took $(( $(date +%s) - start )) s"
cd build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/../scripts/lsan.supp:print_suppressions=0
start=$(date +%s)
ctest --output-on-failure -LE long -E "^avx2_only:" -j"$(nproc)"
echo "sanitize.sh: tests took $(( $(date +%s) - start )) s"
