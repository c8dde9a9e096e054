"""Hostile input to the Python package: arguments out of range, threads sharing a model, Ctrl-C in
dfp.train, LayerOp buffers of other shapes, labels that do not fit. Each is refused with
dfp.Error (or handled) where it crashed or gave wrong results."""
import importlib
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dfp

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs", "python.md")


@pytest.fixture(scope="module")
def ctx():
    return dfp.Context(threads=2, seed=5)


def small_model(ctx, precision="fp32", batch=4, classes=5):
    m = dfp.Model(ctx, "small")
    x = m.input(3, 8, 8)
    x = m.relu(m.conv(x, 8, 3, pad=1, name="conv1"))
    x = m.linear(m.flatten(m.maxpool(x, 2, 2)), classes, name="fc")
    m.softmax_cross_entropy(x)
    m.build(batch, precision=precision)
    return m


def batch_of(n=4, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng.integers(0, classes, n).astype(np.int64)


# ---- the builder ----

def test_concat_of_no_nodes_is_refused(ctx):
    m = dfp.Model(ctx, "c")
    m.input(3, 8, 8)
    with pytest.raises(dfp.InvalidArgumentError, match="concat.*at least one node"):
        m.concat([])


def test_builder_refuses_unknown_nodes_and_zero_strides(ctx):
    m = dfp.Model(ctx, "b")
    x = m.input(3, 8, 8)
    for call in (lambda: m.concat([x, 99]), lambda: m.concat([-1]), lambda: m.add(x, 77), lambda: m.relu(-5),
                 lambda: m.conv(x, 4, 3, stride=0), lambda: m.maxpool(x, 2, 0), lambda: m.avgpool(x, 2, 0)):
        with pytest.raises(dfp.Error):
            call()
    with pytest.raises(TypeError):
        m.concat([x, "conv"])
    with pytest.raises(TypeError):
        m.concat(None)


# ---- the optimizer ----

@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, 1e39])
def test_sgd_step_refuses_a_learning_rate_that_is_not_finite_and_non_negative(ctx, lr):
    m = small_model(ctx)
    sgd = dfp.Sgd(ctx, m)
    x, y = batch_of()
    m.forward(x, y)
    assert m.backward()
    before = {k: v.copy() for k, v in m.state_dict().items()}
    with pytest.raises(dfp.InvalidArgumentError, match=r"Sgd\.step: lr: expected a finite"):
        sgd.step(lr)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    sgd.step(0.0)  # zero is a learning rate


@pytest.mark.parametrize("field", ["momentum", "weight_decay"])
def test_sgd_refuses_factors_that_are_not_finite_and_non_negative(ctx, field):
    m = small_model(ctx)
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(dfp.InvalidArgumentError, match=f"dfp.Sgd: {field}"):
            dfp.Sgd(ctx, m, **{field: bad})


# ---- labels ----

def test_labels_must_be_integer_class_indices(ctx):
    m = small_model(ctx, classes=5)
    x, y = batch_of(classes=5)
    r = m.forward(x, y)  # int64 is fine
    assert r.count == 4
    m.forward(x, list(map(int, y)))  # a list of ints too
    m.forward(x, y.astype(np.uint8))
    for bad, what in [(np.array([0, 1, 2, 2**32 + 3]), "label 4294967299 of image 3"),
                      (np.array([0, 1, 2, -1]), "label -1 of image 3"),
                      (np.array([0, 1, 2, 5]), r"label 5 of image 3 outside \[0, 5\)"),
                      (np.array([0, 1, 2, 2**64 - 1], dtype=np.uint64), "label 18446744073709551615"),
                      (np.array([0.0, 1.0, 2.0, 3.7]), "integer class indices, got dtype float64"),
                      (np.array([0.0, 1.0, 2.0, 3.0]), "integer class indices"),
                      (np.array([True, False, True, True]), "integer class indices"),
                      (np.array(["a", "b", "c", "d"]), "integer class indices"),
                      (np.array([0, 1, 2]), "expected 4 labels")]:
        with pytest.raises(dfp.InvalidArgumentError, match=what):
            m.forward(x, bad)


# ---- threads ----

THREADS_SCRIPT = textwrap.dedent("""
    import threading, numpy as np, dfp
    ctx = dfp.Context(threads=2, seed=5)
    m = dfp.Model(ctx, "t")
    x = m.input(3, 8, 8)
    x = m.relu(m.batchnorm(m.conv(x, 8, 3, pad=1, name="conv1")))
    x = m.linear(m.flatten(m.maxpool(x, 2, 2)), 5, name="fc")
    m.softmax_cross_entropy(x)
    m.build(4, precision="fp32")
    sgd = dfp.Sgd(ctx, m)
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((4, 3, 8, 8)).astype(np.float32) for _ in range(2)]
    labels = rng.integers(0, 5, 4)
    # Two threads predicting on one model: each must get its own images' logits, bit for bit.
    want = [m.predict(a) for a in images]
    bad = []
    def predictor(k):
        for _ in range(300):
            if not np.array_equal(m.predict(images[k]), want[k]):
                bad.append(k)
    ts = [threading.Thread(target=predictor, args=(k,)) for k in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert not bad, f"predictions of another thread's images: {len(bad)}"
    # Training and predicting at once: no crash; a backward whose forward a predict replaced is
    # refused (dfp.Error), the others train.
    errors, steps = [], [0]
    def trainer():
        for _ in range(200):
            r = m.forward(images[0], labels)
            try:
                if m.backward():
                    sgd.step(0.01)
                    steps[0] += 1
            except dfp.Error as e:
                errors.append(str(e))
    def predictor2():
        for _ in range(200):
            z = m.predict(images[1])
            assert z.shape == (4, 5) and np.isfinite(z).all()
    ts = [threading.Thread(target=trainer), threading.Thread(target=predictor2)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert all("backward" in e for e in errors), errors[:3]
    assert steps[0] + len(errors) == 200
    assert np.isfinite(m.forward(images[0], labels).loss)
    print("THREADS OK", steps[0], len(errors))
""")


def test_one_model_from_two_threads_runs_its_calls_one_at_a_time():
    # In a child: a crash (the original segfault) must fail this test, not end the whole session.
    r = subprocess.run([sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "THREADS OK" in r.stdout


# ---- Ctrl-C in dfp.train ----

TRAIN_SCRIPT = textwrap.dedent("""
    import sys, dfp
    def on_epoch(m):
        print("EPOCH", m.epoch, flush=True)
    try:
        dfp.train(model="resnet20", dataset="synthetic", data="classes=4,train=64,test=16", image_size=8,
                  epochs=100000, batch_size=16, threads=1, workers=1, numerics_interval=0, out=sys.argv[1],
                  callback=on_epoch)
    except KeyboardInterrupt as e:
        print("INTERRUPTED", len(getattr(e, "epochs", [])) if hasattr(e, "epochs") else "in-callback", flush=True)
        sys.exit(3)
    print("FINISHED", flush=True)
""")


def test_ctrl_c_stops_dfp_train_and_keeps_the_finished_epochs(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT, str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("EPOCH 1"), line + p.stderr.read()
        p.send_signal(signal.SIGINT)
        # 100000 epochs: only the interrupt ends the run within the wait.
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 3, f"exit {p.returncode}\n{stdout}\n{stderr}"
    assert "INTERRUPTED" in stdout
    assert (out / "checkpoint.dfp").is_file()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 1
    # The run directory is free again (its lock released) and resumable from its checkpoint.
    resumed = dfp.train(model="resnet20", dataset="synthetic", data="classes=4,train=64,test=16", image_size=8,
                        epochs=100000, batch_size=16, threads=1, workers=1, numerics_interval=0, out=str(out),
                        resume=str(out / "checkpoint.dfp"), stop_after=len(lines) + 1)
    assert [e.epoch for e in resumed] == [len(lines) + 1]


# ---- LayerOp ----

def conv_op(ctx, bias=False):
    return dfp.LayerOp(ctx, "conv2d", 3, 4, kernel=3, pad=1, bias=bias, name="op")


def test_layer_op_is_exported_as_dfp_layer_op(ctx):
    assert dfp.LayerOp is dfp._dfp.LayerOp
    assert "LayerOp" in dfp.__all__


def test_layer_op_backward_refuses_shapes_other_than_its_forwards(ctx):
    op = conv_op(ctx)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = np.empty((2, 4, 5, 5), np.float32)
    t = op.forward(x, w, None, 1, y, True, True)
    gw = np.empty_like(w)
    small_dy = np.empty((1, 4, 5, 5), np.float32)
    small_dx = np.empty((1, 3, 5, 5), np.float32)
    # The heap overflow: dy and dx for one image where the forward had two.
    with pytest.raises(dfp.InvalidArgumentError, match=r"layer 'op': backward's x_shape \(1, 3, 5, 5\) is not the "
                                                        r"shape of that forward's input, \(2, 3, 5, 5\)"):
        op.backward(t, small_dy, small_dx, gw, None, [1, 3, 5, 5])
    with pytest.raises(dfp.InvalidArgumentError, match="x_shape"):
        op.backward(t, y, np.empty((2, 3, 4, 4), np.float32), gw, None, [2, 3, 4, 4])
    with pytest.raises(dfp.InvalidArgumentError, match="x_shape"):
        op.backward(t, y, None, gw, None, [2, 3])
    with pytest.raises(dfp.InvalidArgumentError, match="dy must have shape"):
        op.backward(t, small_dy, None, gw, None, [2, 3, 5, 5])
    with pytest.raises(dfp.InvalidArgumentError, match="dx must have shape"):
        op.backward(t, y, small_dx, gw, None, [2, 3, 5, 5])
    with pytest.raises(dfp.InvalidArgumentError, match="weight gradient must have shape"):
        op.backward(t, y, None, gw[:2], None, [2, 3, 5, 5])
    with pytest.raises(dfp.InvalidArgumentError, match="no longer held"):
        op.backward(t + 5, y, None, gw, None, [2, 3, 5, 5])
    dx = np.empty_like(x)
    op.backward(t, y, dx, gw, None, [2, 3, 5, 5])
    assert np.isfinite(dx).all() and np.isfinite(gw).all()
    with pytest.raises(dfp.InvalidArgumentError, match="channels"):
        op.output_shape((1, 7, 5, 5))
    with pytest.raises(dfp.InvalidArgumentError, match="y must have shape"):
        op.forward(x, w, None, 1, small_dy, True, True)


# ---- dfp.torch.compile ----

def _torch():  # imported per test: the rest of the file runs without torch
    return pytest.importorskip("torch")


def tiny_torch_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 5))


@pytest.mark.parametrize("second", ["grad", "no_grad", "eval"])
def test_compiled_backward_after_another_forward_is_refused(second):
    torch = _torch()
    import dfp.torch
    f = dfp.torch.compile(tiny_torch_model(torch), torch.randn(2, 3, 6, 6), precision="fp32")
    x1, x2 = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 6, 6)
    y1 = f(x1)
    y1.sum().backward()  # its own backward right away: fine
    g1 = [p.grad.clone() for p in f.parameters()]
    f.zero_grad()
    y1 = f(x1)
    if second == "grad":
        f(x2)
    elif second == "no_grad":
        with torch.no_grad():
            f(x2)
    else:
        f.eval()
        f(x2)
        f.train()
    with pytest.raises(dfp.Error, match="forward is no longer dfp's last one.*before the module's next forward"):
        y1.sum().backward()
    f.zero_grad()
    y1 = f(x1)
    y1.sum().backward()
    for a, b in zip(g1, f.parameters()):
        torch.testing.assert_close(a, b.grad)


def test_compiled_module_on_no_images_returns_no_logits():
    torch = _torch()
    import dfp.torch
    f = dfp.torch.compile(tiny_torch_model(torch), torch.randn(2, 3, 6, 6), precision="fp32")
    f.eval()
    z = f(torch.empty(0, 3, 6, 6))
    assert tuple(z.shape) == (0, 5) and z.dtype == torch.float32
    with pytest.raises(dfp.InvalidArgumentError, match="example_input.*N >= 1"):
        dfp.torch.compile(tiny_torch_model(torch), torch.empty(0, 3, 6, 6))
    f.train()
    with pytest.raises(ValueError, match="training batch of 0"):
        f(torch.empty(0, 3, 6, 6))


# ---- non-finite input ----

def test_predict_refuses_a_nan_image_in_fp32(ctx):
    m = small_model(ctx, precision="fp32")
    x, _ = batch_of()
    x[1, 2, 3, 4] = np.nan
    with pytest.raises(dfp.Error):
        m.predict(x)


def test_compiled_forward_refuses_a_nan_image_in_fp32():
    torch = _torch()
    import dfp.torch
    f = dfp.torch.compile(tiny_torch_model(torch), torch.randn(2, 3, 6, 6), precision="fp32")
    x = torch.randn(2, 3, 6, 6)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(dfp.Error):
        f(x)
    f.eval()
    with pytest.raises(dfp.Error):
        f(x)


# ---- the docs ----

def test_every_dfp_name_in_the_docs_exists():
    text = open(DOCS, encoding="utf-8").read()
    names = sorted(set(re.findall(r"\bdfp(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)))
    assert names
    missing = []
    for name in names:
        parts = name.split(".")
        if parts[1] == "torch":
            if not _torch_available():
                continue
            importlib.import_module("dfp.torch")
        obj = dfp
        for part in parts[1:]:
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert not missing, f"docs/python.md names what the package lacks: {missing}"


def _torch_available():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def test_ints_beyond_their_range_raise_type_or_value_errors():
    # Found by fuzz_api.py: these raised a bare RuntimeError ("Unable to cast Python instance").
    with pytest.raises(TypeError, match="beyond its range"):
        dfp.PrecisionPolicy(headroom=2**31)
    with pytest.raises(dfp.InvalidArgumentError, match="exponent: expected None or an int"):
        dfp.quantize([1.0], exponent=2**40)
