#!/usr/bin/env bash
# Installs dependencies, builds, and runs dfp's main job on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/src/dfp info
build/src/dfp bench
