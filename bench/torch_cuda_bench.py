#!/usr/bin/env python3
"""PyTorch GPU training throughput beside dfp's CUDA device (bench/cuda_bench.cpp), same card, same run.

Each case trains on one fixed random batch kept in pinned host memory and copied to the GPU every step
(as dfp stages its batch), with SGD (momentum 0.9, weight decay 5e-4) and cross-entropy, and reads the
loss back every step (as dfp's train_step does), so both sides pay the same per-step synchronisation.
Modes:
  fp32     FP32 everywhere, TF32 off (cuDNN and matmul), as dfp's cuda-fp32
  amp      torch.autocast(float16) + GradScaler (init scale 2^16), NCHW, as dfp's cuda-fp16
  amp_cl   the same in channels_last (NHWC, dfp's layout on the GPU)
cudnn.benchmark is on (what PyTorch users set for fixed shapes); dfp takes cuDNN's heuristics instead.

Usage: python3 torch_cuda_bench.py [--cases resnet20:128:32,resnet50:32:224] [--modes fp32,amp,amp_cl]
                                   [--warmup 10] [--steps 50] [--csv FILE]
"""
import argparse, statistics, sys, time


def resnet20(nn, F, torch):
    class Block(nn.Module):
        def __init__(s, cin, cout, stride):
            super().__init__()
            s.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); s.b1 = nn.BatchNorm2d(cout)
            s.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); s.b2 = nn.BatchNorm2d(cout)
            s.pad = cout - cin; s.stride = stride

        def forward(s, x):
            o = F.relu(s.b1(s.c1(x)))
            o = s.b2(s.c2(o))
            sc = x
            if s.stride != 1 or s.pad:  # option A: subsample + zero-pad channels
                sc = x[:, :, ::s.stride, ::s.stride]
                sc = F.pad(sc, (0, 0, 0, 0, s.pad // 2, s.pad - s.pad // 2))
            return F.relu(o + sc)

    class ResNet20(nn.Module):
        def __init__(s, n=3, nc=10):
            super().__init__()
            s.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False); s.bn = nn.BatchNorm2d(16)
            layers, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2)):
                for i in range(n):
                    layers.append(Block(cin, cout, stride if i == 0 else 1)); cin = cout
            s.layers = nn.Sequential(*layers); s.fc = nn.Linear(64, nc)

        def forward(s, x):
            x = F.relu(s.bn(s.conv(x)))
            x = s.layers(x)
            return s.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return ResNet20()


def build(name):
    import torch, torch.nn as nn, torch.nn.functional as F, torchvision
    if name == "resnet20":
        return resnet20(nn, F, torch)
    if name in ("resnet18", "resnet34", "resnet50", "resnet101"):
        return getattr(torchvision.models, name)(num_classes=10)
    raise SystemExit(f"torch_cuda_bench: model '{name}' unknown; expected resnet20, resnet18/34/50/101")


def run(name, batch, side, mode, warmup, steps):
    import torch, torch.nn as nn
    torch.manual_seed(1)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    model = build(name).to(dev)
    cl = mode == "amp_cl"
    if cl:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    crit = nn.CrossEntropyLoss()
    x_host = torch.randn(batch, 3, side, side).pin_memory()
    y_host = (torch.arange(batch) % 10).pin_memory()
    amp = mode in ("amp", "amp_cl")
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, enabled=amp)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=65536.0, enabled=amp)

    def step():
        x = x_host.to(dev, non_blocking=True)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        y = y_host.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    model.train()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    ms, loss = [], 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    return med, statistics.fmean(ms), batch * 1e3 / med, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="resnet20:128:32,resnet50:32:224")
    ap.add_argument("--modes", default="fp32,amp,amp_cl")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--csv")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("torch_cuda_bench: nothing measured: torch sees no CUDA GPU")
        return 0
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    rows = []
    for case in a.cases.split(","):
        name, batch, side = case.split(":")
        for mode in a.modes.split(","):
            if mode not in ("fp32", "amp", "amp_cl"):
                raise SystemExit(f"torch_cuda_bench: mode '{mode}': expected fp32, amp or amp_cl")
            med, mean, ips, loss = run(name, int(batch), int(side), mode, a.warmup, a.steps)
            print(f"{name:10s} b{int(batch):<4d} {side:>4s}x{side:<4s} {mode:6s} median {med:8.3f} ms  "
                  f"mean {mean:8.3f} ms  {ips:9.1f} img/s  loss {loss:.4f}", flush=True)
            rows.append(f"{name},{batch},{side},{mode},{med:.4f},{mean:.4f},{ips:.2f},{loss:.6f}")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("model,batch,side,mode,median_ms,mean_ms,images_per_second,final_loss\n")
            f.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
