#!/usr/bin/env python3
"""PyTorch ResNet-50 training throughput on the CPU, beside bench/resnet50_bench (dfp).

torchvision's resnet50 (1000 classes), 224x224 random images, SGD with momentum 0.9 and weight
decay 5e-4 (as dfp's benchmarks), forward + loss + backward + step, steady state after warm-up,
as ../shared/peers/torch/train_bench.py measures the CIFAR models.

Usage (Debian's torch: /usr/bin/python3):
  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_resnet50_bench.py [--batch 32] \
      [--dtypes fp32,bf16,bf16_cl] [--steps 3] [--warmup 2] [--threads 2] [--no-amx]

  fp32      FP32
  bf16      torch.autocast('cpu', dtype=torch.bfloat16)
  bf16_cl   the same with channels_last tensors
  --no-amx  plays a CPU without AMX: the child runs with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, the
            highest oneDNN ISA below AMX (PyTorch's bundled oneDNN reads it), so BF16 convolutions
            run on AVX512-BF16 (VDPBF16PS) as on Zen 4/5 or Cooper Lake. --show-isa prints the
            implementation oneDNN picks for one BF16 convolution under the same setting.

Each dtype runs in a subprocess of its own; one JSON line per dtype on stdout:
  {"dtype", "batch", "threads", "steps", "ms_per_step" (median), "img_per_s", "onednn_max_cpu_isa"}
"""
import argparse
import json
import os
import subprocess
import sys
import time


def run_one(dtype, batch, steps, warmup, threads):
    import torch
    import torch.nn as nn
    import torchvision

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000)
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 1000, (batch,))
    if dtype.endswith("_cl"):
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    lossf = nn.CrossEntropyLoss()
    bf16 = dtype.startswith("bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = lossf(model(x), y)
        else:
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    print(json.dumps(dict(dtype=dtype, batch=batch, threads=threads, steps=steps, ms_per_step=round(med * 1e3, 1),
                          img_per_s=round(batch / med, 3),
                          onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA", "")), ensure_ascii=True))


def show_isa(env):
    code = ("import torch\n"
            "c = torch.nn.Conv2d(64, 64, 3, padding=1)\n"
            "x = torch.randn(2, 64, 56, 56)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "    c(x)\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, ONEDNN_VERBOSE="1"), capture_output=True,
                         text=True)
    for line in out.stdout.splitlines():
        if ",exec," in line and "convolution" in line:
            print("onednn:", line)
            break
    else:
        print("onednn: no convolution line in ONEDNN_VERBOSE output", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtypes", default="fp32,bf16,bf16_cl")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-amx", action="store_true")
    ap.add_argument("--show-isa", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    for name, v in (("--batch", a.batch), ("--steps", a.steps), ("--threads", a.threads)):
        if v < 1:
            ap.error(f"{name}: expected a whole number >= 1, got {v}")
    if a.one:
        run_one(a.one, a.batch, a.steps, a.warmup, a.threads)
        return
    env = dict(os.environ)
    if a.no_amx:
        env["ONEDNN_MAX_CPU_ISA"] = env["DNNL_MAX_CPU_ISA"] = "AVX512_CORE_BF16"
    if a.show_isa:
        show_isa(env)
    for dtype in a.dtypes.split(","):
        if dtype not in ("fp32", "bf16", "bf16_cl", "fp32_cl"):
            ap.error(f"--dtypes: '{dtype}' is not one of fp32, fp32_cl, bf16, bf16_cl")
        r = subprocess.run([sys.executable, __file__, "--one", dtype, "--batch", str(a.batch), "--steps",
                            str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads)], env=env)
        if r.returncode != 0:
            sys.exit(f"torch_resnet50_bench: {dtype} failed (exit {r.returncode})")


if __name__ == "__main__":
    main()
