#!/usr/bin/env bash
# Installs dependencies, builds, and runs the default test suite (ctest label "long" excluded).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
scripts/install-deps.sh
scripts/build.sh
cd build && ctest --output-on-failure -LE long -j"$(nproc)"
