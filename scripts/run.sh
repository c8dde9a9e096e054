#!/usr/bin/env bash
# Installs dependencies, builds, and runs dfp's main job on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/src/dfp info
# ResNet-20 on Fashion-MNIST (the built-in default dataset) with INT16 (DFP16) convolutions and
# linear layers, 2 epochs (about 3 minutes on 2 cores); metrics and checkpoint under runs/.
build/src/dfp train --model resnet20 --dataset fashion-mnist --precision int16 --epochs 2 \
  --batch-size 128 --lr 0.1 --schedule cosine --threads "$(nproc)" --seed 1 --out runs/resnet20-fmnist-int16
