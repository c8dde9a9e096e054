#!/bin/bash
# Interleaved A/B of conv_bench builds: on a shared, noisy machine two builds are compared only
# round by round, each round running every binary once on the same rows.
#   bench/ab.sh FILTER ROUNDS BINARY...    e.g. bench/ab.sh 'conv/resnet50_b32_c64_k64_in56_3x3_s1/fwd/int16/threads:2' 3 old/conv_bench build/bench/conv_bench
# Prints, per binary and row, the GOP/s of each round in run order.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 FILTER ROUNDS BINARY..." >&2
  exit 2
fi
filter=$1 rounds=$2
shift 2
for ((r = 1; r <= rounds; ++r)); do
  for b in "$@"; do
    "$b" --benchmark_filter="$filter" --benchmark_min_time=0.3 2>&1 | grep -E '^conv' |
      sed -E 's/^conv\/([^ ]*)\/real_time .*GOPS=([0-9.]+).*/\1 \2/' | while read -r row gops; do
        echo "$b $row ${gops%.*}"
      done
  done
done | awk '{k = $1 " " $2; s[k] = s[k] " " $3} END {for (k in s) print k ":" s[k]}' | sort -k2
