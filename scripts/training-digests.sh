#!/usr/bin/env bash
# The training-bits contract: trains ResNet-20 for one short epoch in each precision and prints
# the tensor digest of each checkpoint (scripts/checkpoint_md5.py). A refactor must leave all
# four unchanged; FP32 and BF16 digests depend on the CPU class (oneDNN picks the kernel), so
# compare against digests taken on the same machine. docs/measurements.md lists them per CPU.
# Usage: scripts/training-digests.sh [path/to/dfp] [precisions...]
# A precision with the suffix -slice (int16-slice) trains with --granularity slice (DFP16 exponents
# per image and channel, docs/design/numerics.md); the default four use the default granularity.
set -euo pipefail
here="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
dfp="${1:-$here/build/dfp}"
shift || true
precisions=("$@")
[ ${#precisions[@]} -gt 0 ] || precisions=(int16 fp32 bf16 fp16)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for p in "${precisions[@]}"; do
  extra=()
  [ "${p%-slice}" = "$p" ] || extra=(--granularity slice)
  "$dfp" train --model resnet20 --dataset fashion-mnist --precision "${p%-slice}" "${extra[@]}" --epochs 1 \
    --batch-size 64 --threads 2 --seed 3 --limit-train 1280 --limit-test 500 \
    --out "$work/$p" >/dev/null
  printf '%-6s %s\n' "$p" "$("$py" "$here/scripts/checkpoint_md5.py" "$work/$p/checkpoint.dfp" | cut -d" " -f1)"
done
