#!/usr/bin/env python3
"""Turn conv_bench's Google Benchmark JSON into the INT16-vs-oneDNN comparison table.

Usage:
    conv_bench --benchmark_format=json > run.json      (or --benchmark_out=run.json)
    python3 bench/ratio_table.py run.json [more.json ...] [--check] [--targets avx512|avx2]

Prints one markdown table per thread count: per layer and pass, GOP/s of int16, onednn_f32 and
onednn_bf16, the ratios int16/f32 and int16/bf16, each implementation's share of its instruction
peak (where the run measured it: conv_bench's peak_share) and the verdict against the targets below.
With --check the exit status is 1 when any verdict is FAIL or a targeted row is incomplete.

Benchmark names are conv/<layer>/<pass>/<impl>/threads:<t>[/real_time]; the layer name carries C
and the kernel size (bench/conv_shapes.hpp). With --benchmark_repetitions the median aggregate
is used when present, otherwise the median of the repeated runs.
"""

import argparse
import json
import re
import statistics
import sys

IMPLS = ("int16", "onednn_f32", "onednn_bf16")
PASSES = ("fwd", "bwd_data", "bwd_weights")

# The targets. Each rule: (passes, applies(c, r, s), minimum int16/f32, minimum int16/bf16 or None).
# "avx512": the default levels against oneDNN's AVX-512 FP32 and BF16. "avx2": the avx2 level
# against oneDNN limited to AVX2 (DFP_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2, where oneDNN has no BF16
# convolution to compare with), on every 3x3 and 1x1 row.
TARGET_SETS = {
    "avx512": (
        (("fwd", "bwd_data"), lambda c, r, s: (r, s) in ((3, 3), (1, 1)) and c >= 32, 1.8, 0.95),
        (("bwd_weights",), lambda c, r, s: True, 1.6, None),
    ),
    "avx2": (
        (("fwd", "bwd_data"), lambda c, r, s: (r, s) in ((3, 3), (1, 1)), 1.5, None),
        (("bwd_weights",), lambda c, r, s: True, 1.3, None),
    ),
}
TARGETS = TARGET_SETS["avx512"]

NAME_RE = re.compile(r"^conv/(?P<layer>[^/]+)/(?P<pass>[^/]+)/(?P<impl>[^/]+)/threads:(?P<threads>\d+)")
LAYER_RE = re.compile(r"_c(?P<c>\d+)_k\d+_in\d+_(?P<r>\d+)x(?P<s>\d+)_s\d+")


def load(paths):
    """Returns ({(layer, pass, threads, impl): {"gops": float|None, "share": float|None, "label": str,
    "error": str}}, the layers in order of first appearance). share: GOPS over the instruction peak
    of the implementation's form (conv_bench's peak_share), where the run has it."""
    layers = []
    samples = {}   # key -> list of GOPS from plain runs
    medians = {}   # key -> GOPS from a median aggregate
    share_samples, share_medians = {}, {}
    labels, errors = {}, {}
    for path in paths:
        with (sys.stdin if path == "-" else open(path)) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            m = NAME_RE.match(b.get("run_name") or b.get("name", ""))
            if not m:
                continue
            key = (m["layer"], m["pass"], int(m["threads"]), m["impl"])
            if m["layer"] not in layers:
                layers.append(m["layer"])
            if b.get("error_occurred"):
                errors[key] = b.get("error_message", "error")
                continue
            if b.get("label"):
                labels[key] = b["label"]
            for field, plain, median in (("GOPS", samples, medians), ("peak_share", share_samples, share_medians)):
                value = b.get(field)
                if value is None:
                    continue
                if b.get("run_type") == "aggregate":
                    if b.get("aggregate_name") == "median":
                        median[key] = float(value)
                else:
                    plain.setdefault(key, []).append(float(value))

    def pick(key, plain, median):
        v = median.get(key)
        return statistics.median(plain[key]) if v is None and key in plain else v

    result = {}
    for key in set(samples) | set(medians) | set(errors):
        result[key] = {"gops": pick(key, samples, medians), "share": pick(key, share_samples, share_medians),
                       "label": labels.get(key, ""), "error": errors.get(key, "")}
    return result, layers


def layer_dims(layer):
    m = LAYER_RE.search(layer)
    return (int(m["c"]), int(m["r"]), int(m["s"])) if m else None


def verdict(layer, pass_, r_f32, r_bf16):
    """Returns (target text, verdict) for one row."""
    dims = layer_dims(layer)
    for passes, applies, min_f32, min_bf16 in TARGETS:
        if pass_ not in passes:
            continue
        if dims is None or not applies(*dims):
            return "-", "n/a"
        want = [f">={min_f32:g}x f32"] + ([f">={min_bf16:g}x bf16"] if min_bf16 is not None else [])
        text = ", ".join(want)
        if r_f32 is None or (min_bf16 is not None and r_bf16 is None):
            return text, "INCOMPLETE"
        ok = r_f32 >= min_f32 and (min_bf16 is None or r_bf16 >= min_bf16)
        return text, "pass" if ok else "FAIL"
    return "-", "n/a"


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="Google Benchmark JSON file(s) from conv_bench ('-' for stdin)")
    ap.add_argument("--check", action="store_true", help="exit 1 if any targeted row fails or is incomplete")
    ap.add_argument("--targets", choices=sorted(TARGET_SETS), default="avx512",
                    help="the target set the verdicts use (default avx512)")
    args = ap.parse_args()
    global TARGETS
    TARGETS = TARGET_SETS[args.targets]

    res, layers = load(args.json)
    if not res:
        print("ratio_table: no conv/<layer>/<pass>/<impl>/threads:<t> benchmarks found", file=sys.stderr)
        return 2

    # The benchmark's own layer order, passes in pipeline order.
    order = {name: i for i, name in enumerate(layers)}
    threads_list = sorted({k[2] for k in res})

    counts = {"pass": 0, "FAIL": 0, "INCOMPLETE": 0, "n/a": 0}
    errors = []
    for t in threads_list:
        print(f"\n### threads: {t}\n")
        print("| layer | pass | int16 GOP/s | onednn_f32 GOP/s | onednn_bf16 GOP/s | int16/f32 | int16/bf16 "
              "| int16 % peak | f32 % peak | target | result |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        rows = sorted({(k[0], k[1]) for k in res if k[2] == t},
                      key=lambda lp: (order[lp[0]], PASSES.index(lp[1]) if lp[1] in PASSES else len(PASSES)))
        for layer, pass_ in rows:
            g, share = {}, {}
            for impl in IMPLS:
                e = res.get((layer, pass_, t, impl))
                g[impl] = e["gops"] if e else None
                share[impl] = 100 * e["share"] if e and e["share"] is not None else None
                if e and e["error"]:
                    errors.append(f"{layer}/{pass_}/{impl}/threads:{t}: {e['error']}")
            r_f32 = g["int16"] / g["onednn_f32"] if g["int16"] and g["onednn_f32"] else None
            r_bf16 = g["int16"] / g["onednn_bf16"] if g["int16"] and g["onednn_bf16"] else None
            target, v = verdict(layer, pass_, r_f32, r_bf16)
            counts[v] += 1
            print(f"| {layer} | {pass_} | {fmt(g['int16'])} | {fmt(g['onednn_f32'])} | {fmt(g['onednn_bf16'])} | "
                  f"{fmt(r_f32, 2)} | {fmt(r_bf16, 2)} | {fmt(share['int16'], 0)} | {fmt(share['onednn_f32'], 0)} | "
                  f"{target} | {'**FAIL**' if v == 'FAIL' else v} |")
        # The peaks the shares are of (GOPS / share, the same in every row of one form): their ratio
        # is the int16/f32 ratio a row reaches where both run at the same share of their peaks.
        peak = {}
        for impl in ("int16", "onednn_f32"):
            est = [e["gops"] / e["share"] for k, e in res.items()
                   if k[2] == t and k[3] == impl and e["gops"] and e["share"]]
            if est:
                peak[impl] = statistics.median(est)
        if len(peak) == 2:
            print(f"\nInstruction peaks measured by the run: int16 {peak['int16']:.1f} GOP/s, onednn_f32 "
                  f"{peak['onednn_f32']:.1f}: at equal shares of them int16/f32 is "
                  f"{peak['int16'] / peak['onednn_f32']:.2f}")

    impls_seen = {}
    for (layer, pass_, t, impl), e in res.items():
        if e["label"]:
            impls_seen.setdefault(impl, set()).add(e["label"])
    print("\nImplementations: " +
          "; ".join(f"{i}: {', '.join(sorted(impls_seen[i]))}" for i in IMPLS if i in impls_seen))
    print(f"\nSummary: {counts['pass']} pass, {counts['FAIL']} fail, {counts['INCOMPLETE']} incomplete, "
          f"{counts['n/a']} without target")
    if errors:
        print("\nErrors:")
        for e in errors:
            print(f"- {e}")
    if args.check and (counts["FAIL"] or counts["INCOMPLETE"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
