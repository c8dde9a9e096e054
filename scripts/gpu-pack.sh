#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that has NVIDIA's driver, CUDA 13 and
# cuDNN 9 (as wheels or a toolkit) but none of dfp's Debian libraries and no package registry:
# the CUDA-enabled binaries of BUILD (default build/), the Debian shared libraries they load,
# a fallback set of this machine's C/C++ runtime (used only if that machine's glibc is older), and
# a Fashion-MNIST subset for the trainer test. Writes .gpu/pack.tar.xz (ignored by git), which
# the device call carries. Build first: cmake --build BUILD --target dfp_cli cuda_test
# cuda_plan_test cuda_bench dfp_cuda_gpu (nvcc 13 and cuDNN 9, as /usr/local/cuda here).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
build=${1:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,glibc,data/fashion-mnist}
for f in dfp tests/cuda_test tests/cuda_plan_test bench/cuda_bench src/libdfp_cuda_gpu.so; do
  test -f "$build/$f" || { echo "gpu-pack: $build/$f is missing: build it first" >&2; exit 1; }
  cp "$build/$f" "$stage/bin/"
done
strip --strip-unneeded "$stage"/bin/*
# Debian libraries the binaries load (not CUDA's: that machine has its own).
for l in libdnnl.so.2 libtbb.so.12 libturbojpeg.so.0 libgomp.so.1 libOpenCL.so.1 libz.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$stage/lib/"
done
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$stage/glibc/" 2>/dev/null || cp -L "/lib64/$l" "$stage/glibc/"
done
# Fashion-MNIST: the first 6400 training images (what Cuda.TrainerRunsOnTheGpu reads) and the
# whole test split (the checkpoint is evaluated on all of it).
src=/usr/share/datasets/fashion-mnist
if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
  /usr/bin/python3 - "$src" "$stage/data/fashion-mnist" <<'PY'
import gzip, struct, sys, shutil
src, dst = sys.argv[1], sys.argv[2]
n = 6400
with gzip.open(f"{src}/train-images-idx3-ubyte.gz") as f:
    magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
    body = f.read(n * rows * cols)
with gzip.open(f"{dst}/train-images-idx3-ubyte.gz", "wb") as f:
    f.write(struct.pack(">IIII", magic, n, rows, cols) + body)
with gzip.open(f"{src}/train-labels-idx1-ubyte.gz") as f:
    magic, count = struct.unpack(">II", f.read(8))
    body = f.read(n)
with gzip.open(f"{dst}/train-labels-idx1-ubyte.gz", "wb") as f:
    f.write(struct.pack(">II", magic, n) + body)
for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
PY
fi
mkdir -p .gpu
tar -C "$stage" -cf - . | xz -T2 -6 > .gpu/pack.tar.xz
ls -la .gpu
