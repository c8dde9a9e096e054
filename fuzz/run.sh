#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (fuzz/CMakeLists.txt) and runs one for a bounded time:
#   fuzz/run.sh CLANGXX BUILD_DIR TARGET SECONDS
# It starts from the committed corpus fuzz/corpus/TARGET (left unchanged: new inputs go to
# BUILD_DIR/corpus/TARGET) and writes a crashing input to BUILD_DIR/crashes/TARGET/; copy that
# into fuzz/crashes/TARGET/ so that the default suite replays it. Exits non-zero on a finding.
set -euo pipefail
cxx=$1 build=$2 target=$3 seconds=$4
src=$(cd "$(dirname "$0")" && pwd)
cmake -S "$src" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build" --target "$target" -j"$(nproc)"
mkdir -p "$build/corpus/$target" "$build/crashes/$target"
"$build/$target" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
  -artifact_prefix="$build/crashes/$target/" "$build/corpus/$target" "$src/corpus/$target"
