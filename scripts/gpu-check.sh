#!/usr/bin/env bash
# The CUDA device on a real GPU, in one command: unpacks .gpu/pack.tar.xz (scripts/gpu-pack.sh),
# finds the machine's CUDA 13 / cuDNN 9 libraries, then runs
#   1. the CUDA tests (cuda_test: Cuda.*, on the GPU; cuda_plan_test: the host emulation),
#   2. dfp train --device cuda in fp16 and fp32 on synthetic images: ResNet-20 (32x32, batch 128)
#      and ResNet-50 (224x224, batch 32),
#   3. cuda_bench (steady-state dfp steps) and bench/torch_cuda_bench.py (PyTorch FP32 and AMP)
#      on the same card, one after the other,
# and writes logs, metrics and throughput.csv to $OUT (or ./gpu-out). Each stage has its own time
# limit, so that one hang leaves the rest. Usage: scripts/gpu-check.sh [quick]; STAGES=tests,train,bench
# (the default) picks the stages (dfp-only or torch-only: bench with one side); ALGOS=heuristic,benchmark and PROFILE=N (steps timed per layer)
# go to cuda_bench.
set -u
cd "$(dirname "$(readlink -f "$0")")/.."
repo=$PWD
out=${OUT:-$repo/gpu-out}
mkdir -p "$out"
log=$out/run.log
exec > >(tee "$log") 2>&1
quick=${1:-}
stages=${STAGES:-tests,train,bench}
want() { case ",$stages," in *",$1,"*) return 0 ;; esac; return 1; }
want dfp-only || want torch-only && stages="$stages,bench"
root=/tmp/dfpgpu
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf .gpu/pack.tar.xz || { echo "gpu-check: cannot unpack .gpu/pack.tar.xz"; exit 1; }

echo "== machine"
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
grep -m1 'model name' /proc/cpuinfo; nproc
(. /etc/os-release && echo "$PRETTY_NAME"); ldd --version | head -1
cudadirs=""
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9; do
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda*/ /opt /usr/lib/x86_64-linux-gnu /usr/local/lib -name "$l" 2>/dev/null | head -1)
  if [ -z "$f" ]; then echo "gpu-check: $l not found on this machine"; else echo "$l: $f"; cudadirs="$cudadirs:$(dirname "$f")"; fi
done
export LD_LIBRARY_PATH="$root/bin:$root/lib$cudadirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run=""
if ! "$root/bin/dfp" --version >/dev/null 2>&1; then
  echo "gpu-check: the binaries do not start with this machine's C runtime:"; "$root/bin/dfp" --version 2>&1 | head -3
  echo "gpu-check: running them with the packed loader and C/C++ runtime instead"
  run="$root/glibc/ld-linux-x86-64.so.2 --library-path $root/glibc:$LD_LIBRARY_PATH"
fi
# The module is found next to the program, or on the search path (with the packed loader,
# /proc/self/exe is the loader).
ldd "$root/bin/libdfp_cuda_gpu.so" | grep -E 'not found|cudnn|cublas|cudart'
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && [ -d "$root/data/fashion-mnist" ]; then
  mkdir -p /usr/share/datasets && cp -r "$root/data/fashion-mnist" /usr/share/datasets/
fi

echo "== dfp info"
timeout 60 $run "$root/bin/dfp" info 2>&1 | tee "$out/info.txt"

if want tests; then
echo "== tests"
timeout 240 $run "$root/bin/cuda_test" --gtest_output=xml:"$out/cuda_test.xml" 2>&1 | grep -E '^\[ *(RUN|OK|FAILED|SKIPPED|PASSED|==========) *\]|Failure|error|Expected|Which is|actual' | head -150
timeout 120 $run "$root/bin/cuda_plan_test" --gtest_output=xml:"$out/cuda_plan_test.xml" 2>&1 | grep -E '^\[ *(FAILED|PASSED|==========) *\]|Failure' | head -40

fi
if want train; then
echo "== dfp train --device cuda"
runs=$root/runs
mkdir -p "$runs"
train() {  # name model side batch precision data
  timeout 150 $run "$root/bin/dfp" train --device cuda --lr 0.02 --model $2 --dataset synthetic --image-size "$3" \
    --batch-size "$4" --precision $5 --data "$6" --epochs 2 --threads "$(nproc)" --seed 1 --out "$runs/$1" 2>&1 |
    grep -E 'device|epoch [0-9]+/[0-9]+ done|error|unsupported|invalid|internal'
}
train resnet20-fp16 resnet20 32 128 "fp16 --loss-scaling dynamic" classes=10,train=25600,test=2560
train resnet20-fp32 resnet20 32 128 fp32 classes=10,train=25600,test=2560
train resnet50-fp16 resnet50 224 32 "fp16 --loss-scaling dynamic" classes=10,train=3200,test=640
train resnet50-fp32 resnet50 224 32 fp32 classes=10,train=3200,test=640
train resnet50-fp16-bench "resnet50 --cudnn-benchmark" 224 32 "fp16 --loss-scaling dynamic" classes=10,train=3200,test=640
tar -C "$runs" -czf "$out/runs.tar.gz" --exclude=checkpoint.dfp . 2>/dev/null

fi
if want bench; then
echo "== steady-state throughput, same card, one after the other"
steps=50; [ "$quick" = quick ] && steps=20
want torch-only || timeout 200 $run "$root/bin/cuda_bench" --cases resnet20:128:32,resnet50:32:224 --precisions fp16,fp32 \
  --warmup 10 --steps $steps --algos "${ALGOS:-heuristic,benchmark}" --profile "${PROFILE:-0}" --csv "$out/cuda_bench.csv"
want dfp-only || PYTHONUNBUFFERED=1 timeout 240 python3 bench/torch_cuda_bench.py --cases resnet20:128:32,resnet50:32:224 \
  --modes fp32,amp,amp_cl --warmup 10 --steps $steps --csv "$out/torch_cuda_bench.csv"

echo "== throughput.csv"
{
  echo "framework,mode,model,batch,side,median_ms,images_per_second"
  [ -f "$out/cuda_bench.csv" ] && tail -n +2 "$out/cuda_bench.csv" | awk -F, '{print "dfp,cuda-"$4"-"$5","$1","$2","$3","$6","$8}'
  [ -f "$out/torch_cuda_bench.csv" ] && tail -n +2 "$out/torch_cuda_bench.csv" | awk -F, '{print "pytorch,"$4","$1","$2","$3","$5","$7}'
} > "$out/throughput.csv"
sed 's/,/\t/g' "$out/throughput.csv"
fi
