#!/usr/bin/env python3
"""dfp.torch.compile against dfp's own model and PyTorch, one process, the same threads.

A training step (forward, loss, backward, SGD with momentum 0.9 and weight decay 5e-4) on a fixed
random batch, timed after warm-up, for:
  dfp        the zoo model driven from Python (Model.forward/backward + dfp.Sgd): what `dfp train`
             runs per step
  compiled   dfp.torch.compile(torch model) with torch's cross-entropy and torch.optim.SGD
  compiled+  the same with dfp.torch.optim.SGD (the update in dfp's pass, the re-quantization from
             its maxima: the optimizer step dfp's own runs)
  torch      the torch model in FP32 (torch's own CPU kernels)
Rounds alternate the three so that the machine's drift hits them alike; the median per variant
is reported, with the ratios compiled/dfp and compiled/torch.

Usage: /usr/bin/python3 bench/torch_compile_bench.py [--model resnet18c] [--precision int16]
       [--batch 64] [--size 32] [--threads 2] [--rounds 5] [--steps 3]
"""
import argparse, copy, statistics, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import dfp
import dfp.torch as dt


def torch_model(name):
    if name == "resnet18c":
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = nn.Identity()
        return m
    raise SystemExit(f"torch_compile_bench: model '{name}' unknown; expected resnet18c")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18c")
    ap.add_argument("--precision", default="int16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    ctx = dfp.Context(threads=a.threads, seed=1)
    x = torch.randn(a.batch, 3, a.size, a.size)
    y = torch.randint(0, 10, (a.batch,))
    xn, yn = x.numpy(), y.numpy().astype(np.int32)

    tm = torch_model(a.model)
    ref = copy.deepcopy(tm)
    compiled = dt.compile(copy.deepcopy(tm), x, precision=a.precision, ctx=ctx)
    compiled_f = dt.compile(copy.deepcopy(tm), x, precision=a.precision, ctx=ctx)
    zoo = dfp.Model.from_zoo(a.model, 3, a.size, a.size, 10, ctx)
    zoo.build(a.batch, precision=a.precision)
    sgd = dfp.Sgd(ctx, zoo, momentum=0.9, weight_decay=5e-4)
    opt_c = torch.optim.SGD(compiled.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    opt_t = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    opt_f = dt.optim.SGD(compiled_f.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, ctx=ctx)

    def step_dfp():
        zoo.forward(xn, yn, train=True)
        zoo.backward()
        sgd.step(0.01)

    def torch_step(model, opt):
        def run():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return run

    variants = {"dfp": step_dfp, "compiled": torch_step(compiled, opt_c), "compiled+": torch_step(compiled_f, opt_f),
                "torch": torch_step(ref, opt_t)}
    for f in variants.values():  # warm-up: plans, first-touch, oneDNN primitive creation
        f()
        f()
    times = {k: [] for k in variants}
    for _ in range(a.rounds):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(a.steps):
                f()
            times[k].append((time.perf_counter() - t0) / a.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model} {a.precision} batch {a.batch} {a.size}x{a.size}, {a.threads} threads, torch {torch.__version__}")
    for k in variants:
        print(f"  {k:9s} {med[k] * 1e3:9.1f} ms/step  {a.batch / med[k]:8.1f} img/s   "
              f"(rounds: {', '.join(f'{t * 1e3:.0f}' for t in times[k])} ms)")
    for k in ("compiled", "compiled+"):
        print(f"  {k + ' / dfp':17s}  {med['dfp'] / med[k]:.3f}  (target >= 0.97, issue 46)")
        print(f"  {k + ' / torch':17s}  {med['torch'] / med[k]:.3f}  (target >= 1.8)")
    print(f"  weight re-quantizations: {compiled.weight_syncs} for {2 + a.rounds * a.steps} steps (one per "
          f"optimizer step); tensors copied into dfp: {compiled.weight_copies} (each parameter and buffer once; the "
          f"parameters are views of dfp's weights from then on)")


if __name__ == "__main__":
    main()
