"""The model's API for other programs from Python: logits/predict without labels, backward from a
caller's loss gradient, the input gradient, the state as shaped zero-copy views (state,
state_dict, tensor, load_state_dict), and state files (save_state, load_state)."""
import numpy as np
import pytest

import dfp


@pytest.fixture(scope="module")
def ctx():
    return dfp.Context(threads=2, seed=3)


def images(n, c, h, w, seed=0):
    return np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)


def labels_for(n, classes):
    return ((np.arange(n) * 7 + 3) % classes).astype(np.int32)


def small_net(ctx, precision="fp32", batch=8, classes=10, seed_ctx=None, input_grad=False):
    """Every kind of parameter and buffer: conv with bias, BatchNorm, a grouped conv, Linear."""
    m = dfp.Model(seed_ctx or ctx, "small")
    x = m.input(3, 8, 8)
    x = m.relu(m.batchnorm(m.conv(x, 16, 3, 1, 1, True, "conv1"), "bn1"), "relu1")
    x = m.relu(m.conv(x, 32, 3, 2, 1, False, "conv2", groups=4), "relu2")
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), classes, True, "fc"))
    m.build(batch, precision=precision, input_grad=input_grad)
    return m


def log_softmax(z):
    z = z.astype(np.float64)
    zmax = z.max(axis=1, keepdims=True)
    return z - (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))


def cross_entropy(z, y):
    return -log_softmax(z)[np.arange(len(y)), y].mean()


def cross_entropy_grad(z, y):
    """The built-in loss's gradient as a caller computes it: float((p - onehot) / n), p the softmax
    rounded to float32 as the model keeps it (the sum over the classes taken in their order)."""
    n, k = z.shape
    z64 = z.astype(np.float64)
    zmax = z.max(axis=1).astype(np.float64)
    total = np.zeros(n)
    for c in range(k):
        total += np.exp(z64[:, c] - zmax)
    p = np.exp(z64 - (zmax + np.log(total))[:, None]).astype(np.float32)
    onehot = np.zeros((n, k))
    onehot[np.arange(n), y] = 1.0
    return ((p.astype(np.float64) - onehot) / n).astype(np.float32)


def grads(m):
    return [p.grad.copy() for p in m.parameters()]


@pytest.mark.parametrize("precision", ["fp32", "int16"])
def test_predict_gives_the_logits_of_forwards_loss(ctx, precision):
    m = small_net(ctx, precision)
    assert m.classes == 10
    x, y = images(8, 3, 8, 8, seed=1), labels_for(8, 10)
    z = m.predict(x)
    assert z.dtype == np.float32 and z.shape == (8, 10)
    loss = m.forward(x, y, train=False).loss
    assert cross_entropy(z, y) == pytest.approx(loss, rel=1e-5)
    np.testing.assert_array_equal(m.logits(x), z)


def test_predict_on_fewer_images_gives_the_first_rows(ctx):
    m = small_net(ctx, "fp32")
    x = images(8, 3, 8, 8, seed=2)
    z = m.predict(x)
    for count in (1, 3):
        np.testing.assert_array_equal(m.predict(x[:count]), z[:count])
    with pytest.raises(dfp.InvalidArgumentError, match=r"\(count, 3, 8, 8\)"):
        m.predict(x[:, :2])


@pytest.mark.parametrize("precision", ["fp32", "int16"])
def test_backward_from_the_cross_entropy_gradient_equals_the_builtin(ctx, precision):
    m = small_net(ctx, precision)
    x, y = images(8, 3, 8, 8, seed=3), labels_for(8, 10)
    m.forward(x, y, train=True)
    assert m.backward()
    builtin = grads(m)
    m.step = 0  # the same random streams for the second pass
    z = m.logits(x, train=True)
    assert m.backward(cross_entropy_grad(z, y))
    for p, expected in zip(m.parameters(), builtin):
        assert np.array_equal(p.grad, expected), p.name
    with pytest.raises(dfp.InvalidArgumentError, match=r"\(8, 10\)"):
        m.backward(np.zeros((4, 10), np.float32))


def test_a_numpy_mse_loss_trains_lenet(ctx):
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, 10, ctx)
    m.build(16, precision="int16")
    sgd = dfp.Sgd(ctx, m, momentum=0.9, weight_decay=0.0)
    x, y = images(16, 1, 28, 28, seed=4), labels_for(16, 10)
    target = np.eye(10)[y]
    losses = []
    for _ in range(40):
        z = m.logits(x, train=True).astype(np.float64)
        losses.append(((z - target) ** 2).mean())
        assert m.backward((2 * (z - target) / z.size).astype(np.float32))
        sgd.step(0.1)
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0], losses


def test_input_gradient_matches_finite_differences(ctx):
    # The input feeds two convolutions and a BatchNorm on batch statistics; no ReLU: a smooth loss.
    m = dfp.Model(ctx, "tiny")
    inp = m.input(2, 5, 5)
    a = m.conv(inp, 4, 3, 1, 1, True, "a")
    b = m.conv(inp, 4, 1, 1, 0, False, "b")
    x = m.batchnorm(m.add(a, b, "add"), "bn")
    m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 3, True, "fc"))
    m.set_input_grad(True)
    m.build(2, precision="fp32")
    xs, y = images(2, 2, 5, 5, seed=5), np.array([0, 2], np.int32)
    m.forward(xs, y, train=True)
    with pytest.raises(dfp.InvalidArgumentError, match="backward"):
        m.input_grad()
    m.backward()
    g = m.input_grad()
    assert g.dtype == np.float32 and g.shape == (2, 2, 5, 5)
    eps = 1e-2
    for idx in np.ndindex(*xs.shape):
        keep = xs[idx]
        xs[idx] = keep + eps
        up = m.forward(xs, y, train=True).loss
        xs[idx] = keep - eps
        down = m.forward(xs, y, train=True).loss
        xs[idx] = keep
        fd = (up - down) / (2 * eps)
        assert abs(g[idx] - fd) <= 2e-3 + 2e-2 * abs(fd), (idx, g[idx], fd)
    plain = small_net(ctx, "fp32", batch=2)
    with pytest.raises(dfp.InvalidArgumentError, match="set_input_grad"):
        plain.input_grad()


def test_state_dict_has_torch_names_shapes_and_shares_memory(ctx):
    m = dfp.Model.from_zoo("resnet18", 3, 32, 32, 10, ctx)
    m.build(1, precision="int16")
    sd = m.state_dict()
    assert sd["conv1.weight"].shape == (64, 3, 7, 7)
    assert sd["fc.weight"].shape == (10, 512)
    assert sd["bn1.running_mean"].shape == (64,)
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in sd.values())
    names = list(sd)
    assert names[: len(m.parameters())] == [p.name for p in m.parameters()]  # parameters, then buffers
    conv1 = next(p for p in m.parameters() if p.name == "conv1.weight")
    assert np.shares_memory(sd["conv1.weight"], conv1.value)
    assert sd["fc.weight"].base is m
    state = m.state()
    assert list(state) == names
    t = m.tensor("bn1.running_mean")
    assert isinstance(t, dfp.Tensor) and not t.trainable and t.grad is None and t.shape == (64,)
    assert np.shares_memory(t.value, sd["bn1.running_mean"])
    w = state["fc.weight"]
    assert w.trainable and w.grad.shape == (10, 512) and np.shares_memory(w.grad, m.tensor("fc.weight").grad)
    with pytest.raises(dfp.InvalidArgumentError, match="no tensor named 'fc.wieght'"):
        m.tensor("fc.wieght")
    assert m.policy.precision == "int16"


def test_load_state_dict_round_trip_and_errors(ctx):
    a = small_net(ctx, "int16")
    x, y = images(8, 3, 8, 8, seed=6), labels_for(8, 10)
    a.forward(x, y, train=True)  # running statistics of their own
    b = small_net(ctx, "int16", seed_ctx=dfp.Context(threads=2, seed=9))
    assert not np.array_equal(a.predict(x), b.predict(x))
    snapshot = {k: v.copy() for k, v in a.state_dict().items()}
    b.load_state_dict(snapshot)
    np.testing.assert_array_equal(b.predict(x), a.predict(x))
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, snapshot[k])
    bad = dict(snapshot, **{"fc.weight": np.zeros((5, 32), np.float32)})
    before = b.state_dict()["conv1.weight"].copy()
    b.state_dict()["conv1.weight"][:] = 0  # restored below: nothing is copied when a shape is wrong
    with pytest.raises(dfp.InvalidArgumentError, match=r"'fc\.weight'.*\(5, 32\).*\(10, 32\)"):
        b.load_state_dict(bad)
    assert not b.state_dict()["conv1.weight"].any()
    b.state_dict()["conv1.weight"][:] = before
    missing = {k: v for k, v in snapshot.items() if k != "bn1.running_var"}
    with pytest.raises(dfp.InvalidArgumentError, match="bn1.running_var"):
        b.load_state_dict(missing)
    with pytest.raises(dfp.InvalidArgumentError, match="extra.weight"):
        b.load_state_dict(dict(snapshot, **{"extra.weight": np.zeros(3)}))
    b.load_state_dict(missing, strict=False)


@pytest.mark.parametrize("precision", ["int16", "fp32"])
def test_state_files_round_trip(ctx, tmp_path, precision):
    a = small_net(ctx, precision)
    sgd = dfp.Sgd(ctx, a, momentum=0.9, weight_decay=0.0)
    x, y = images(8, 3, 8, 8, seed=7), labels_for(8, 10)
    for _ in range(2):
        a.forward(x, y, train=True)
        a.backward()
        sgd.step(0.05)
    path = tmp_path / "small.dfp"
    dfp.save_state(a, path)
    assert dfp.read_state_policy(path).precision == precision
    b = small_net(ctx, precision, seed_ctx=dfp.Context(threads=2, seed=11))
    dfp.load_state(b, str(path))
    np.testing.assert_array_equal(b.predict(x), a.predict(x))
    assert dfp.STATE_VERSION >= 1


def test_bad_state_files_name_the_file(ctx, tmp_path):
    m = small_net(ctx, "fp32")
    path = tmp_path / "state.dfp"
    dfp.save_state(m, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt = tmp_path / "corrupt.dfp"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(dfp.Error, match="corrupt.dfp") as info:
        dfp.load_state(m, corrupt)
    assert info.value.status == "corrupt_data"
    with pytest.raises(dfp.Error, match="absent.dfp") as info:
        dfp.load_state(m, tmp_path / "absent.dfp")
    assert info.value.status == "io_error"
