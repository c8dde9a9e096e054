#!/usr/bin/python3
"""Training step of a torchvision model converted by dfp.torch.convert against the same model in
PyTorch FP32, in one process on the same threads (issue 46's target: INT16 >= 1.5x PyTorch FP32
on AVX-512 VNNI), with where the converted layers' time goes. Two conversions run side by side:
layer by layer (convert(model)), and with example_input (convert(model, example_input=x): the
blocks dfp runs whole become segments), the latter also with dfp.torch.optim.SGD (the update in
dfp's pass, the segments' weights re-quantized from its maxima).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_bridge_bench.py [--threads 2] [--batch 64]
        [--model resnet18c] [--precision int16] [--reps 5] [--steps 2] [--warmup 2] [--keep-fp32 conv1]

A step is zero_grad, forward, cross-entropy, backward and torch.optim.SGD (momentum 0.9, weight
decay 5e-4) on random 3x32x32 images (resnet18c: torchvision's resnet18 with a 3x3 stride-1 conv1
and no max-pool, 10 classes; vgg11bn: torchvision's vgg11_bn with a 512 -> 10 classifier). The two
models start from the same weights; reps alternate between them and the median rep counts.

Per converted layer (ms per step): layout = NCHW <-> dfp's blocked layout (x, y, dy, dx); weights =
loading the weights after each optimizer step (copy, DFP16 quantization, packing); fwd / bwd =
dfp's passes (operand quantization included); glue = the rest of the layer's call as torch sees it
(Python, autograd, tensor allocation, dtype checks).

It runs as a user would, with no OpenMP setting: dfp's loops share torch's OpenMP pool
(docs/design/threads.md); the header line shows OMP_WAIT_POLICY if one is set.
"""
import argparse
import copy
import os
import statistics
import time


import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

import dfp  # noqa: E402
import dfp.torch as dt  # noqa: E402


def make_model(name):
    if name == "resnet18c":
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = nn.Identity()
        return m
    if name == "vgg11bn":
        m = torchvision.models.vgg11_bn(num_classes=10)
        m.avgpool = nn.Identity()
        m.classifier = nn.Linear(512, 10)
        return m
    raise SystemExit(f"unknown model {name}: resnet18c or vgg11bn")


def timed_steps(model, opt, x, y, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", default="resnet18c")
    ap.add_argument("--precision", default="int16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--keep-fp32", default="", help="comma-separated glob patterns left to torch")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    ref = make_model(a.model)
    model = copy.deepcopy(ref)
    ctx = dfp.Context(threads=a.threads, seed=1)
    keep = [p for p in a.keep_fp32.split(",") if p]
    names = dt.convert(model, a.precision, keep_fp32=keep, ctx=ctx)
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))
    segmented = copy.deepcopy(ref)
    seg_names = dt.convert(segmented, a.precision, keep_fp32=keep, ctx=ctx, example_input=x)
    segmented_f = copy.deepcopy(ref)
    dt.convert(segmented_f, a.precision, keep_fp32=keep, ctx=ctx, example_input=x)
    runs = {}
    for label, m, sgd in (("pytorch fp32", ref, torch.optim.SGD), (f"dfp.torch {a.precision}", model, torch.optim.SGD),
                          (f"segments {a.precision}", segmented, torch.optim.SGD),
                          (f"+ dfp.torch.optim", segmented_f, dt.optim.SGD)):
        m.train()
        runs[label] = (m, sgd(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4), [])
        timed_steps(m, runs[label][1], x, y, a.warmup)
    for _ in range(a.reps):
        for label, (m, opt, times) in runs.items():
            if m is model:
                dt.reset_layer_times(model)
            times.append(timed_steps(m, opt, x, y, a.steps))
    layer_times = dt.layer_times(model)  # of the last rep

    print(f"# {a.model}, batch {a.batch}, {a.threads} threads, {a.reps} reps x {a.steps} steps, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, torch {torch.__version__}, dfp context "
          f"{ctx.threads} threads isa {ctx.isa}; {len(names)} layers converted; segments: {', '.join(seg_names)}")
    med = {}
    for label, (_, _, times) in runs.items():
        med[label] = statistics.median(times)
        print(f"{label:>18}: {a.batch / med[label]:7.1f} images/s  (step {1000 * med[label]:.0f} ms; reps "
              + ", ".join(f"{1000 * t:.0f}" for t in times) + " ms)")
    base, conv = med["pytorch fp32"], med[f"dfp.torch {a.precision}"]
    seg, seg_f = med[f"segments {a.precision}"], med["+ dfp.torch.optim"]
    print(f"ratio dfp.torch {a.precision} / pytorch fp32: {base / conv:.2f}; with segments {base / seg:.2f}, "
          f"and dfp.torch.optim.SGD {base / seg_f:.2f}  (target >= 1.5 for resnet18c int16 on AVX-512 VNNI)")

    steps = a.steps
    print("\nper converted layer, ms per step (the last rep):")
    print(f"{'layer':<24}{'layout':>8}{'weights':>9}{'fwd':>8}{'bwd':>8}{'glue':>8}{'total':>8}  kernel")
    tot = dict.fromkeys(("layout", "weights", "fwd", "bwd", "glue", "total"), 0.0)
    for name, t in layer_times.items():
        row = {"layout": t["layout_seconds"], "weights": t["weights_seconds"], "fwd": t["forward_seconds"],
               "bwd": t["backward_seconds"]}
        row["total"] = t["python_forward_seconds"] + t["python_backward_seconds"]
        row["glue"] = row["total"] - sum(row[k] for k in ("layout", "weights", "fwd", "bwd"))
        for k in tot:
            tot[k] += row[k]
        impl = dict(dt.dfp_layers(model))[name]._op.implementation.split(" | ")[0]
        print(f"{name:<24}" + "".join(f"{1000 * row[k] / steps:{w}.1f}" for k, w in
                                         (("layout", 8), ("weights", 9), ("fwd", 8), ("bwd", 8), ("glue", 8),
                                          ("total", 8))) + f"  {impl}")
    print(f"{'all converted layers':<24}" + "".join(f"{1000 * tot[k] / steps:{w}.1f}" for k, w in
                                                   (("layout", 8), ("weights", 9), ("fwd", 8), ("bwd", 8),
                                                    ("glue", 8), ("total", 8))))
    last = runs[f"dfp.torch {a.precision}"][2][-1]  # the rep the layer times are from
    rest = last - tot["total"] / steps
    print(f"\nlast rep's step {1000 * last:.0f} ms = converted layers {1000 * tot['total'] / steps:.0f} ms (of which layout "
          f"{1000 * tot['layout'] / steps:.0f}, weight loads {1000 * tot['weights'] / steps:.0f}, glue "
          f"{1000 * tot['glue'] / steps:.0f}) + torch's layers, loss and optimizer {1000 * rest:.0f} ms")


if __name__ == "__main__":
    main()
