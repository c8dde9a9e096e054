#!/usr/bin/python3
"""Which shared-exponent slicing keeps a CNN's gradients from underflowing: the share of every
convolution's nonzero output gradients (dy) that round to zero under a 16-bit integer format with
one exponent per slice, for several slicings, measured on the gradients of an FP32 PyTorch
training run of ResNet-20 (option A shortcuts, as dfp's) on Fashion-MNIST or CIFAR-10.

A slice's exponent puts its largest |value| in [2^(14-h), 2^(15-h)) (DFP16 with headroom h,
include/dfp/dfp16.hpp), so a value is lost where |v| <= 2^(floor(log2 max) - 15 + h), half a step
(round to nearest). The slicings, for dy of shape (images, channels, rows, columns):

  tensor          one exponent (dfp's `tensor`)
  image           per image (dfp's `slice`, the backward-data copy)
  pair,block      per image pair and 16-channel block (dfp's `slice`, the weight-gradient copy)
  image,block     per image and 16-channel block
  image,chan      per image and channel
  image,chan,row  per image, channel and row

Usage: /usr/bin/python3 bench/underflow_slicings.py [--dataset fashion-mnist|cifar10] [--data DIR]
  [--steps N] [--sample-steps a,b] [--seed S] [--threads T]
It prints, at each sampled step and headroom (2, dfp's default, and 1), one row per convolution
(% of nonzero dy lost per slicing). Figures: docs/design/numerics.md.
"""
import argparse
import glob
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def fashion_mnist(data):
    def idx(name, offset):
        path = os.path.join(data, name)
        if not os.path.exists(path):
            sys.exit(f"{path}: not found (Debian: apt-get install dataset-fashion-mnist)")
        with gzip.open(path) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    x = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255
    y = idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    return (torch.tensor(x) - 0.2860) / 0.3530, torch.tensor(y)


def cifar10(data):
    files = sorted(glob.glob(os.path.join(data, "data_batch_*.bin")))
    if not files:
        sys.exit(f"{data}: no data_batch_*.bin (CIFAR-10 binary version)")
    raw = np.concatenate([np.fromfile(f, np.uint8).reshape(-1, 3073) for f in files])
    x = raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
    return (torch.tensor(x) - mean) / std, torch.tensor(raw[:, 0].astype(np.int64))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        sc = x
        if self.stride != 1 or self.pad:  # option A: subsample, pad channels with zeros
            sc = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + sc)


class ResNet20(nn.Module):
    def __init__(self, channels, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages, cin = [], 16
        for i, c in enumerate((16, 32, 64)):
            stages.append(nn.Sequential(*[Block(cin if j == 0 else c, c, 2 if i > 0 and j == 0 else 1)
                                          for j in range(3)]))
            cin = c
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x))))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def lost_percent(g, keep, headroom):
    """% of g's nonzero values that round to zero with one exponent per slice; the slices are the
    index tuples of the dimensions in `keep` (every other dimension shares the exponent)."""
    a = g.abs()
    mx = a
    for d in sorted((d for d in range(a.dim()) if d not in keep), reverse=True):
        mx = mx.amax(dim=d, keepdim=True)
    threshold = torch.exp2(torch.floor(torch.log2(mx.clamp_min(1e-38))) - 15 + headroom)
    nonzero = a > 0
    return 100.0 * float((nonzero & (a <= threshold)).sum()) / max(1.0, float(nonzero.sum()))


def slicings(g):
    n, k, h, w = g.shape
    blocks = max(1, k // 16)
    pairs = g[: n - n % 2].reshape(n // 2, 2, k, h, w).transpose(1, 2)  # (pair, channel, image, h, w)
    return {
        "tensor": lambda hr: lost_percent(g, [], hr),
        "image": lambda hr: lost_percent(g, [0], hr),
        "pair,block": lambda hr: lost_percent(pairs.reshape(n // 2, blocks, -1), [0, 1], hr),
        "image,block": lambda hr: lost_percent(g.reshape(n, blocks, -1), [0, 1], hr),
        "image,chan": lambda hr: lost_percent(g, [0, 1], hr),
        "image,chan,row": lambda hr: lost_percent(g, [0, 1, 2], hr),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=("fashion-mnist", "cifar10"), default="fashion-mnist")
    ap.add_argument("--data", help="the dataset's directory (default: Debian's Fashion-MNIST)")
    ap.add_argument("--steps", type=int, default=469, help="training steps of batch 128 (469: one Fashion-MNIST epoch)")
    ap.add_argument("--sample-steps", help="steps to measure, comma-separated (default: the middle and the last)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if args.dataset == "fashion-mnist":
        x, y = fashion_mnist(args.data or "/usr/share/datasets/fashion-mnist")
    else:
        if not args.data:
            sys.exit("--dataset cifar10 needs --data DIR (the binary version's data_batch_*.bin)")
        x, y = cifar10(args.data)
    samples = ({int(s) for s in args.sample_steps.split(",")} if args.sample_steps
               else {args.steps // 2, args.steps - 1})
    model = ResNet20(x.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    grads, sampling = {}, [False]

    def keep_output_gradient(name):
        def hook(_module, _inputs, out):
            if sampling[0]:
                out.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))
        return hook

    convs = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(keep_output_gradient(name))
    batch = 128
    order = torch.randperm(len(x))
    print(f"ResNet-20, {args.dataset}, {len(x)} images, batch {batch}, seed {args.seed}, torch {torch.__version__}")
    model.train()
    for step in range(args.steps):
        start = (step * batch) % (len(x) - batch + 1)
        b = order[start:start + batch]
        sampling[0] = step in samples
        loss = F.cross_entropy(model(x[b]), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not sampling[0]:
            continue
        names = list(slicings(grads[convs[0]]))
        print(f"\nstep {step}, loss {loss.item():.3f}: % of nonzero dy lost to underflow")
        for headroom in (2, 1):
            print(f"headroom {headroom}: | layer | " + " | ".join(names) + " |")
            for name in convs:
                cells = " | ".join(f"{f(headroom):.2f}" for f in slicings(grads[name]).values())
                print(f"| {name} | {cells} |")
        grads.clear()


if __name__ == "__main__":
    main()
