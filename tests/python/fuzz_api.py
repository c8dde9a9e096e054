"""A fuzzer of the Python API: random call sequences on small models.

Each batch of calls runs in a child process with its own seed, so that a crash (a signal) is seen
and reported with the seed that reproduces it. Random arguments, valid and not: building models
layer by layer, predict, forward / backward / Sgd.step, state files, state_dict, numerics,
quantize, LayerOp passes. Any exception but dfp.Error, ValueError and TypeError is a failure, and
so is a crash or a hang.

    fuzz_api.py [--seed S] [--seconds T] [--iterations N]   # batches until T seconds have passed
    fuzz_api.py --child --seed S --iterations N             # one batch (what a failure names)

ctest runs it under the labels "fuzz" and "long" (python:fuzz_api). Exits 77 (skip) without NumPy.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

ALLOWED = (ValueError, TypeError)  # dfp.Error is added once dfp is imported


class Fuzz:
    def __init__(self, seed, tmp):
        import numpy as np
        import dfp
        self.np, self.dfp = np, dfp
        self.r = random.Random(seed)
        self.g = np.random.default_rng(seed)
        self.tmp = tmp
        self.ctx = dfp.Context(threads=self.r.choice([1, 2]), seed=seed % 1000 + 1)
        self.models = []  # (model, sgd or None)
        self.ops = []     # (LayerOp, {ticket: x shape})

    # ---- random values ----
    def small_int(self, lo=-2, hi=9):
        # Not 2**31 - 1: a layer of that many channels is a legal request that takes minutes to
        # initialise, not an error (beyond int's range pybind raises TypeError).
        return self.r.choice([self.r.randint(lo, hi), self.r.randint(1, 4), 0, -1, 2**31, 2**63 - 1])

    def good_int(self, lo, hi):
        return self.r.randint(lo, hi) if self.r.random() < 0.85 else self.small_int()

    def sized(self, shape):
        """shape, if an array of it stays small (else ValueError: the fuzzer makes no huge arrays)."""
        count = 1
        for d in shape:
            count *= max(int(d), 0)
        if count > 1 << 20:
            raise ValueError(f"fuzzer: no array of shape {tuple(shape)}")
        return tuple(shape)

    def empty(self, shape):
        return self.np.empty(self.sized(shape), self.np.float32)

    def floats(self, shape):
        np = self.np
        shape = self.sized(shape)
        kind = self.r.random()
        if kind < 0.7:
            a = self.g.standard_normal(shape).astype(np.float32)
        elif kind < 0.8:
            a = (self.g.standard_normal(shape) * 1e30).astype(np.float32)
        elif kind < 0.85:
            a = self.g.standard_normal(shape).astype(np.float64)
        elif kind < 0.9:
            a = np.zeros(shape, np.float32)
        else:
            a = self.g.standard_normal(shape).astype(np.float32)
            if a.size:
                a.flat[self.r.randrange(a.size)] = self.r.choice([np.nan, np.inf, -np.inf])
        if self.r.random() < 0.05 and a.ndim >= 2:
            a = a.swapaxes(0, 1)  # not C-contiguous
        return a

    def shape_near(self, shape):
        s = list(shape)
        if self.r.random() < 0.75:
            return tuple(s)
        i = self.r.randrange(len(s)) if s else 0
        choice = self.r.random()
        if choice < 0.4 and s:
            s[i] = max(0, s[i] + self.r.choice([-1, 1, -s[i]]))
        elif choice < 0.7:
            s = s[:-1]
        else:
            s.append(1)
        return tuple(s)

    # ---- actions ----
    def build_model(self):
        dfp, r = self.dfp, self.r
        m = dfp.Model(self.ctx, r.choice(["m", "fuzz", "x" * 40]))
        c, h = self.good_int(1, 4), self.good_int(4, 10)
        x = m.input(c, h, h)
        nodes = [x]
        for _ in range(r.randint(0, 5)):
            x = r.choice(nodes) if r.random() < 0.3 else x
            kind = r.choice(["conv", "bn", "relu", "maxpool", "avgpool", "add", "concat", "dropout", "lrn", "gap",
                             "shortcut", "by_name"])
            if kind == "by_name":  # any registry kind by name, with its fields (and an odd one) at hostile values
                k = r.choice(dfp.layer_kinds() + [{"name": r.choice(["pool", "", "x" * 50]), "fields": []}])
                params = {f["name"]: r.choice([1, 2, 3, 0, -1, 0.5, True, float("nan"), float("inf"), 2**40])
                          for f in k["fields"] if r.random() < 0.9}
                if r.random() < 0.1:
                    params[r.choice(["width", "p", "size"])] = r.choice([1, "x", None, [1]])
                inputs = r.choice([x, [x], [x, r.choice(nodes)], [], [self.small_int()], "x", [0.5]])
                x = m.layer(k["name"], inputs, r.choice(["", "n" + str(len(nodes))]), **params)
            elif kind == "conv":
                x = m.conv(x, self.good_int(1, 12), self.good_int(1, 3), self.good_int(1, 2), self.good_int(0, 1),
                           r.random() < 0.5, "", r.choice([1, 1, 1, 2, self.small_int()]))
            elif kind == "bn":
                x = m.batchnorm(x, "", r.choice([1e-5, 1e-3, 0.0, -1.0, float("nan")]))
            elif kind == "relu":
                x = m.relu(x)
            elif kind == "maxpool":
                x = m.maxpool(x, self.good_int(1, 3), self.good_int(1, 2), self.good_int(0, 1), r.random() < 0.3)
            elif kind == "avgpool":
                x = m.avgpool(x, self.good_int(1, 3), self.good_int(1, 2), self.good_int(0, 1))
            elif kind == "add":
                x = m.add(x, r.choice(nodes + [self.small_int()]))
            elif kind == "concat":
                x = m.concat(r.sample(nodes, r.randint(0, len(nodes))) + ([self.small_int()] if r.random() < 0.1 else []))
            elif kind == "dropout":
                x = m.dropout(x, r.choice([0.0, 0.5, 0.9, 1.0, -0.1, float("nan")]))
            elif kind == "lrn":
                x = m.lrn(x, self.good_int(1, 5), r.choice([1e-4, -1.0, float("inf")]), 0.75, r.choice([1.0, 2.0, 0.0]))
            elif kind == "gap":
                x = m.global_avgpool(x)
            else:
                x = m.shortcut_pad(x, self.good_int(1, 16), self.good_int(1, 2))
            nodes.append(x)
        if r.random() < 0.9:
            x = m.linear(m.flatten(x), self.good_int(1, 7), r.random() < 0.7)
        if r.random() < 0.95:
            m.softmax_cross_entropy(x, r.choice([0.0, 0.1, 0.0, 1.0, -0.5]))
        precision = r.choice(["fp32", "int16", "bf16", "fp16", "int16", "int8"])
        m.build(self.good_int(1, 4), precision=precision,
                **({"headroom": self.small_int()} if r.random() < 0.1 else {}))
        sgd = None
        if r.random() < 0.8:
            sgd = dfp.Sgd(self.ctx, m, momentum=r.choice([0.9, 0.0, -1.0, float("nan")]),
                          weight_decay=r.choice([5e-4, 0.0, float("inf")]), nesterov=r.random() < 0.3)
        self.models.append((m, sgd))
        if len(self.models) > 3:
            self.models.pop(0)

    def model(self):
        if not self.models:
            self.build_model()
        return self.r.choice(self.models)

    def images(self, m, train=False):
        _, c, h, w = m.shape(0)
        n = m.batch if train else self.r.randint(1, m.batch)
        return self.floats(self.shape_near((n, c, h, w)))

    def predict(self):
        m, _ = self.model()
        self.np.asarray(m.predict(self.images(m)))

    def forward(self):
        m, _ = self.model()
        x = self.images(m, train=True)
        n = x.shape[0] if x.ndim else 0
        kind = self.r.random()
        if kind < 0.7:
            y = self.g.integers(0, m.classes, n)
        elif kind < 0.8:
            y = self.g.integers(-3, 2**33, n)
        elif kind < 0.9:
            y = self.g.standard_normal(n)
        else:
            y = self.g.integers(0, m.classes, self.r.randint(0, n + 2)).astype(self.r.choice(["int8", "uint64"]))
        m.forward(x, y, train=self.r.random() < 0.9)

    def logits_backward(self):
        m, _ = self.model()
        if self.r.random() < 0.5:
            m.logits(self.images(m, train=True), train=True)
        g = self.floats(self.shape_near((m.batch, m.classes)))
        m.backward(g if self.r.random() < 0.7 else None)
        if self.r.random() < 0.3:
            m.input_grad()

    def step(self):
        m, sgd = self.model()
        if sgd is not None:
            sgd.step(self.r.choice([0.01, 0.1, 0.0, -1.0, float("nan"), float("inf"), 1e30]))

    def state(self):
        m, _ = self.model()
        path = os.path.join(self.tmp, "s.dfp")
        kind = self.r.random()
        if kind < 0.3:
            self.dfp.save_state(m, path)
        elif kind < 0.5:
            self.dfp.load_state(m, path)
        elif kind < 0.6 and os.path.exists(path):
            with open(path, "r+b") as f:  # corrupt a byte of the file
                data = f.read()
                if data:
                    f.seek(self.r.randrange(len(data)))
                    f.write(bytes([self.r.randrange(256)]))
        elif kind < 0.8:
            sd = {k: v.copy() for k, v in m.state_dict().items()}
            if sd and self.r.random() < 0.5:
                k = self.r.choice(list(sd))
                sd[k] = self.floats(self.shape_near(sd[k].shape))
            m.load_state_dict(sd, strict=self.r.random() < 0.5)
        else:
            for p in m.parameters():
                p.value[...] = self.floats(p.value.shape).astype(self.np.float32)
            m.weights_updated()

    def numerics(self):
        m, _ = self.model()
        if self.r.random() < 0.3:
            m.set_numerics_interval(self.small_int())
        m.numerics()
        m.summary()
        m.step = self.r.choice([0, 1, 10**6, -1])

    def quantize(self):
        a = self.floats(self.shape_near((self.r.randint(0, 40),)))
        e = self.r.choice([None, 0, -20, 40, 2**31])
        q, exp = self.dfp.quantize(a, exponent=e, rounding=self.r.choice(["nearest", "stochastic", "biased", "up"]),
                                   headroom=self.r.choice([2, 0, -1, 99]), ctx=self.ctx)
        self.dfp.dequantize(q, self.r.choice([exp, 2**31 - 1, -(2**31)]), ctx=self.ctx)

    def layer_op(self):
        r, np = self.r, self.np
        if not self.ops or r.random() < 0.2:
            kind = r.choice(["conv2d", "linear", "conv2d", "pool"])
            spec = dict(in_channels=self.good_int(1, 5), out_channels=self.good_int(1, 6))
            if kind == "conv2d":
                spec.update(kernel=self.good_int(1, 3), stride=self.good_int(1, 2), pad=self.good_int(0, 1),
                            groups=r.choice([1, 1, 2]))
            spec["bias"] = r.random() < 0.5
            op = self.dfp.LayerOp(self.ctx, kind, name=r.choice(["op", "op", ""]),
                                  policy=self.dfp.PrecisionPolicy(precision=r.choice(["fp32", "int16", "bf16"])),
                                  **spec)
            spec["linear"] = kind == "linear"
            self.ops.append((op, spec, {}))
            if len(self.ops) > 3:
                self.ops.pop(0)
        op, spec, tickets = r.choice(self.ops)
        c, k = spec["in_channels"], spec["out_channels"]
        wshape = (k, c) if spec["linear"] else (k, c // spec.get("groups", 1), spec.get("kernel", 1), spec.get("kernel", 1))
        if r.random() < 0.6 or not tickets:
            n = r.randint(1, 3)
            shape = self.shape_near((n, c) if spec["linear"] else (n, c, r.randint(1, 6), r.randint(1, 6)))
            x = self.floats(shape)
            y = self.empty(self.shape_near(op.output_shape(list(shape))))
            w = self.floats(self.shape_near(wshape))
            b = self.floats((k,)) if r.random() < 0.5 else None
            t = op.forward(x, w, b, r.randint(0, 3), y, r.random() < 0.8, r.random() < 0.5)
            if t:
                tickets[t] = shape
        else:
            t = r.choice(list(tickets) + [0, 99999])
            shape = tickets.get(t, (1, c) if spec["linear"] else (1, c, 2, 2))
            dy = self.floats(self.shape_near(op.output_shape(list(shape))))
            dx = self.empty(self.shape_near(shape)) if r.random() < 0.5 else None
            gw = self.empty(self.shape_near(wshape))
            gb = self.empty((k,)) if r.random() < 0.5 else None
            op.backward(t, dy, dx, gw, gb, list(self.shape_near(shape)))
        if r.random() < 0.1:
            op.numerics()
            op.times()

    def run(self, iterations):
        actions = [self.build_model, self.predict, self.forward, self.logits_backward, self.step, self.state,
                   self.numerics, self.quantize, self.layer_op]
        weights = [3, 4, 4, 3, 3, 2, 1, 2, 4]
        allowed = ALLOWED + (self.dfp.Error,)
        for i in range(iterations):
            action = self.r.choices(actions, weights)[0]
            try:
                action()
            except allowed:
                pass
            except Exception:
                print(f"iteration {i}: {action.__name__} raised an exception dfp should not:", flush=True)
                traceback.print_exc()
                return 2
        return 0


def child(seed, iterations):
    with tempfile.TemporaryDirectory(prefix="dfp_fuzz_api_") as tmp:
        return Fuzz(seed, tmp).run(iterations)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("DFP_FUZZ_SEED", "1")))
    ap.add_argument("--seconds", type=float, default=60.0, help="run batches until this much time has passed")
    ap.add_argument("--iterations", type=int, default=300, help="calls per batch (one child process)")
    ap.add_argument("--batch-timeout", type=float, default=120.0, help="seconds before a batch counts as hung")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError:
        print(f"skipped: {sys.executable} lacks numpy")
        return 77
    if a.child:
        return child(a.seed, a.iterations)
    start, batch, failures = time.monotonic(), 0, 0
    while time.monotonic() - start < a.seconds:
        seed = a.seed + batch
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--seed", str(seed), "--iterations",
               str(a.iterations)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.batch_timeout)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = "hang", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        if rc != 0:
            failures += 1
            why = f"signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit {rc}"
            print(f"FAIL seed {seed} ({why}); reproduce: {sys.executable} {os.path.abspath(__file__)} --child "
                  f"--seed {seed} --iterations {a.iterations}\n{out[-4000:]}", flush=True)
        batch += 1
    print(f"fuzz_api: {batch} batches of {a.iterations} calls from seed {a.seed}, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
