#!/usr/bin/env bash
# Installs dependencies, builds, and runs dfp's main job on its built-in default.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
scripts/install-deps.sh
scripts/build.sh
build/dfp info
# FP32, BF16, FP16 (dynamic loss scaling) and INT16 training of ResNet-20 on Fashion-MNIST (the
# built-in default dataset), same seed and data order, 2 epochs on 12,800 images each: a few
# minutes on 2 cores. Prints the comparison table; report and plots under runs/compare/ (--overwrite:
# a rerun replaces the previous comparison).
build/dfp compare --model resnet20 --dataset fashion-mnist --precisions fp32,bf16,fp16,int16 \
  --epochs 2 --limit-train 12800 --batch-size 128 --lr 0.1 --schedule cosine --threads "$(nproc)" \
  --seed 1 --out runs/compare --overwrite
