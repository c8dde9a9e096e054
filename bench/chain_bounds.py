#!/usr/bin/python3
"""How long the forward pass's INT32 chains could be under two overflow bounds, for the DFP16
operands that meet issue 31's SQNR targets (x per image at headroom 1, w per output channel at
headroom 2), on an FP32 PyTorch ResNet-20 (bench/underflow_slicings.py's network and data).

A chain of n units ((16-channel input block, tap) pairs, 8 VPDPWSSD steps each) is safe for output
lane k where the window's sum of |x|*|w| stays within INT32. dfp bounds it by a * sum of the
window's per-unit L1 norms of w[k] (a: the largest |x| of the rows a call reads; chains.cpp). A
second bound, r1 * sum of the window's per-unit max |w[k]| (r1: the largest L1 norm of x over a
unit's 16 channels at one pixel), also holds; a call could take the longer of the two chains.
Printed per layer: the units of its reduction, a, r1, and the longest safe chain under each bound
over the whole batch (the shortest call's chain, as metrics' chain_fwd / 8).

Usage: /usr/bin/python3 bench/chain_bounds.py [--steps N] [--seed S]
"""
import argparse
import importlib.util
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("underflow_slicings", os.path.join(here, "underflow_slicings.py"))
us = importlib.util.module_from_spec(spec)
spec.loader.exec_module(us)

INT32_MAX = 2**31 - 1


def quantized_abs(t, keep, headroom):
    """|q| of DFP16 with one exponent per slice (the dimensions in keep), round to nearest."""
    a = t.abs()
    mx = a
    for d in sorted((d for d in range(t.dim()) if d not in keep), reverse=True):
        mx = mx.amax(dim=d, keepdim=True)
    step = torch.exp2(torch.floor(torch.log2(mx.clamp_min(1e-38))) - 14 + headroom)
    return torch.round(a / step).clamp(max=32767)


def longest_chain(per_unit, bound):
    """The most consecutive units whose per_unit sums, times bound, stay within INT32 for every lane."""
    lanes, units = per_unit.shape
    prefix = torch.cat([torch.zeros(lanes, 1, dtype=torch.float64), per_unit.double().cumsum(1)], 1)
    best = 0
    for n in range(1, units + 1):
        if bound * float((prefix[:, n:] - prefix[:, :-n]).amax()) > INT32_MAX:
            break
        best = n
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="training steps of batch 128 before measuring")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    x, y = us.fashion_mnist("/usr/share/datasets/fashion-mnist")
    model = us.ResNet20(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    order = torch.randperm(len(x))
    for step in range(args.steps):
        b = order[(step * 128) % (len(x) - 127):][:128]
        loss = F.cross_entropy(model(x[b]), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    seen = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Conv2d) and mod.in_channels % 16 == 0:
            mod.register_forward_hook(lambda mod, i, o, name=name: seen.__setitem__(name, (i[0].detach(), mod.weight.detach())))
    with torch.no_grad():
        model(x[order[:128]])
    print(f"ResNet-20, Fashion-MNIST, after {args.steps} steps; x per image at headroom 1, w per output channel at headroom 2")
    print("| layer | units | a | r1 | chain from a * L1(w) | chain from r1 * max|w| |")
    for name, (xi, w) in seen.items():
        n, c, h, wd = xi.shape
        k, blocks = w.shape[0], c // 16
        xq = quantized_abs(xi, [0], 1)
        wq = quantized_abs(w, [0], 2).reshape(k, blocks, 16, -1)  # lane, block, channel, tap
        l1 = wq.sum(2).reshape(k, -1)  # units: block outer, tap inner, as the kernel runs them
        mx = wq.amax(2).reshape(k, -1)
        a = float(xq.amax())
        r1 = float(xq.reshape(n, blocks, 16, h, wd).sum(2).amax())
        print(f"| {name} | {l1.shape[1]} | {a:.0f} | {r1:.0f} | {longest_chain(l1, a)} | {longest_chain(mx, r1)} |")


if __name__ == "__main__":
    main()
