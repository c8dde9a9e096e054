#!/usr/bin/env python3
"""Tables and per-layer figures of a formats study from `dfp compare` directories.

Usage: scripts/formats-study.py [--epoch E] [--svg DIR] COMPARE_DIR...

Each COMPARE_DIR holds one run per precision (its sub-directories, as `dfp compare --out` writes
them); directories of different seeds are pooled by run label. A run that has not finished its
epochs is left out (and named on stderr). Prints Markdown:
  - per format: test top-1 (mean and sample standard deviation over the seeds, and the seeds'
    count), its difference from fp32's mean, and the numerics of epoch E's last sampled step
    (default: the last epoch) averaged over the seeds: SQNR of x, w and dy (mean over the
    weighted layers / the worst layer) and the share of nonzero dy and x values that round to
    zero;
  - per format: where it breaks: the layer with the lowest dy SQNR and the layer and class with the
    largest underflow.
With --svg DIR, writes gnuplot SVG figures of dy SQNR and dy underflow per layer, every format side
by side (first seed of each), and the scripts that made them (needs gnuplot).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys


def read_run(path):
    cfg = json.load(open(os.path.join(path, "config.json")))
    epochs = [json.loads(line) for line in open(os.path.join(path, "metrics.jsonl")) if line.strip()]
    epochs = [e for e in epochs if "epoch" in e]
    if len(epochs) < cfg.get("epochs", 1):
        print(f"{path}: {len(epochs)} of {cfg.get('epochs')} epochs; left out", file=sys.stderr)
        return cfg, None
    return cfg, epochs


def layer_figures(layers):
    """Mean and worst SQNR per class, underflow shares of dy and x, over the sampled layers."""
    sampled = [l for l in layers if "sqnr_x_db" in l]
    if not sampled:
        return None
    out = {}
    for c in ("x", "w", "dy"):
        v = [l[f"sqnr_{c}_db"] for l in sampled if math.isfinite(l[f"sqnr_{c}_db"]) and l[f"sqnr_{c}_db"] > 0]
        out[f"sqnr_{c}"] = (statistics.mean(v), min(v)) if v else None
    for c in ("dy", "x"):
        nz = sum(l.get(f"nonzero_{c}", 0) for l in sampled)
        out[f"under_{c}"] = 100.0 * sum(l.get(f"underflow_{c}", 0) for l in sampled) / nz if nz else 0.0
    worst = min(sampled, key=lambda l: l["sqnr_dy_db"] if l["sqnr_dy_db"] > 0 else float("inf"))
    out["worst_dy_layer"] = (worst["layer"], worst["sqnr_dy_db"])
    best = (None, None, -1.0)
    for l in sampled:
        for c in ("x", "w", "dy"):
            nz = l.get(f"nonzero_{c}", 0)
            share = 100.0 * l.get(f"underflow_{c}", 0) / nz if nz else 0.0
            if share > best[2]:
                best = (l["layer"], c, share)
    out["worst_underflow"] = best
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--epoch", type=int, default=0, help="the epoch whose numerics are tabulated (0: the last)")
    ap.add_argument("--svg", help="write per-layer figures here")
    ap.add_argument("--title", default="", help="the figures' title")
    a = ap.parse_args()

    runs = {}  # label -> list of (seed, epochs)
    order = []
    for d in a.dirs:
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
                continue
            cfg, epochs = read_run(path)
            if epochs is None:
                continue
            label = cfg.get("label", name)
            if label not in runs:
                runs[label] = []
                order.append(label)
            runs[label].append((cfg.get("seed"), epochs))
    preferred = ["fp32", "bf16", "fp16", "int16", "int16-block128", "int16-block64", "int16-block32", "fp8", "mxfp8",
                 "mxint8", "mxfp6", "mxfp4", "posit16", "posit16es2"]
    order.sort(key=lambda l: preferred.index(l) if l in preferred else len(preferred))

    def top1(label):
        return [ep[-1]["test_top1"] for _, ep in runs[label]]

    base = statistics.mean(top1("fp32")) if "fp32" in runs else None
    print("| format | seeds | test top-1 % mean ± sd | vs fp32 | SQNR x dB mean / worst | SQNR w dB | SQNR dy dB "
          "| dy underflow | x underflow |")
    print("|---|---:|---|---:|---|---|---|---:|---:|")
    where = []
    for label in order:
        t = top1(label)
        sd = f"{statistics.stdev(t):.2f}" if len(t) > 1 else "–"
        figs = []
        for _, ep in runs[label]:
            e = ep[a.epoch - 1] if a.epoch else ep[-1]
            f = layer_figures(e.get("layers", []))
            if f:
                figs.append(f)
        def cell(key):
            v = [f[key] for f in figs if f[key]]
            if not v:
                return "–"
            return f"{statistics.mean(m for m, _ in v):.1f} / {statistics.mean(w for _, w in v):.1f}"
        def share(key):
            return f"{statistics.mean(f[key] for f in figs):.3g} %" if figs else "–"
        diff = f"{statistics.mean(t) - base:+.2f}" if base is not None and label != "fp32" else "–"
        print(f"| {label} | {len(t)} | {statistics.mean(t):.2f} ± {sd} | {diff} | {cell('sqnr_x')} | "
              f"{cell('sqnr_w')} | {cell('sqnr_dy')} | {share('under_dy')} | {share('under_x')} |")
        if figs:
            f = figs[0]
            where.append((label, f["worst_dy_layer"], f["worst_underflow"]))
    print()
    print("| format | lowest dy SQNR (layer, dB) | largest underflow (layer, class, share) |")
    print("|---|---|---|")
    for label, (wl, wv), (ul, uc, us) in where:
        print(f"| {label} | {wl}, {wv:.1f} | {ul}, {uc}, {us:.3g} % |")

    if a.svg:
        os.makedirs(a.svg, exist_ok=True)
        sampled = [(label, runs[label][0][1][a.epoch - 1] if a.epoch else runs[label][0][1][-1]) for label in order]
        sampled = [(l, [x for x in e.get("layers", []) if "sqnr_dy_db" in x]) for l, e in sampled]
        sampled = [(l, ls) for l, ls in sampled if ls]
        names = [x["layer"] for x in sampled[0][1]]
        for what, col, ylabel in (("sqnr_dy", lambda x: x["sqnr_dy_db"], "dy SQNR (dB)"),
                                  ("underflow_dy", lambda x: 100.0 * x["underflow_dy"] / max(1, x["nonzero_dy"]),
                                   "dy values rounded to zero (%)")):
            data = os.path.join(a.svg, f"{what}.dat")
            with open(data, "w") as f:
                f.write("# layer " + " ".join(l for l, _ in sampled) + "\n")
                for i, name in enumerate(names):
                    vals = []
                    for _, ls in sampled:
                        v = col(ls[i]) if i < len(ls) and ls[i]["layer"] == name else float("nan")
                        vals.append(f"{v:.4g}" if math.isfinite(v) else "NaN")
                    f.write(f"{name} " + " ".join(vals) + "\n")
            gp = os.path.join(a.svg, f"{what}.gp")
            with open(gp, "w") as f:
                f.write(f"set terminal svg size 1000,480 font 'sans,11'\nset output '{what}.svg'\n")
                if a.title:
                    f.write(f"set title '{a.title}'\n")
                f.write(f"set ylabel '{ylabel}'\nset xtics rotate by -60 font ',8'\nset key outside right\n"
                        "set grid ytics\nset datafile missing 'NaN'\n")
                plots = [f"'{what}.dat' using {k + 2}:xtic(1) with linespoints title '{l}'" for k, (l, _) in enumerate(sampled)]
                f.write("plot " + ", \\\n     ".join(plots) + "\n")
            subprocess.run(["gnuplot", f"{what}.gp"], cwd=a.svg, check=True)
            print(f"wrote {os.path.join(a.svg, what + '.svg')}", file=sys.stderr)


if __name__ == "__main__":
    main()
