"""dfp.Model from Python: the zoo, layer-by-layer building, the precision policy, zero-copy
parameter views, and training steps (forward, backward, Sgd)."""
import gc

import numpy as np
import pytest

import dfp


@pytest.fixture(scope="module")
def ctx():
    return dfp.Context(threads=2, seed=3)


def random_batch(n, c, h, w, classes, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, c, h, w)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


def test_zoo_names_and_from_zoo(ctx):
    names = dfp.models.names()
    assert "lenet" in names and "resnet20" in names
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, 10, ctx)
    assert not m.built
    m.build(4, precision="int16")
    assert m.built and m.batch == 4 and m.parameter_count > 0
    assert "int16" in m.summary()
    with pytest.raises(dfp.InvalidArgumentError, match="nosuchnet"):
        dfp.Model.from_zoo("nosuchnet", 1, 28, 28, 10, ctx)


def small_model(ctx, **policy):
    m = dfp.Model(ctx, "small")
    x = m.input(3, 8, 8)
    x = m.conv(x, 16, 3, pad=1, name="conv1")
    x = m.batchnorm(x, name="bn1")
    x = m.relu(x)
    x = m.maxpool(x, 2, 2)
    x = m.flatten(x)
    x = m.linear(x, 5, name="fc")
    m.softmax_cross_entropy(x)
    m.build(4, **policy)
    return m, x


def test_layer_by_layer_and_policy_keywords(ctx):
    m, out = small_model(ctx, precision="int16", overrides="fc=fp32", headroom=3)
    assert m.shape(out) == (4, 5, 1, 1)
    names = [p.name for p in m.parameters()]
    assert any(n.startswith("conv1") for n in names) and any(n.startswith("fc") for n in names)
    summary = m.summary()
    assert "int16" in summary and "fp32" in summary


def test_any_layer_kind_by_name(ctx):
    kinds = {k["name"]: k for k in dfp.layer_kinds()}
    assert kinds["lrn"]["torch_module"] == "LocalResponseNorm"
    assert [f["name"] for f in kinds["lrn"]["fields"]] == ["size", "alpha", "beta", "k"]
    assert kinds["concat"]["inputs"] == -1 and kinds["batchnorm"]["short_name"] == "bn"
    a, b = dfp.Model(ctx, "k"), dfp.Model(ctx, "k")
    x = a.input(3, 8, 8)
    x = a.layer("conv", x, "conv1", out_channels=8, kernel=3, pad=1, bias=True)
    x = a.layer("lrn", [x], size=3, alpha=1e-3, k=2)
    x = a.layer("concat", [x, x], "cat")
    x = a.layer("linear", a.layer("flatten", a.layer("global_avgpool", x)), "fc", out_features=4)
    a.softmax_cross_entropy(x)
    y = b.input(3, 8, 8)
    y = b.lrn(b.conv(y, 8, 3, pad=1, bias=True, name="conv1"), 3, 1e-3, 0.75, 2)
    y = b.linear(b.flatten(b.global_avgpool(b.concat([y, y], "cat"))), 4, name="fc")
    b.softmax_cross_entropy(y)
    assert a.summary() == b.summary()
    with pytest.raises(dfp.InvalidArgumentError, match="lrn has no parameter 'width'"):
        a.layer("lrn", 0, width=2)
    with pytest.raises(dfp.InvalidArgumentError, match="parameter 'size' is required"):
        a.layer("lrn", 0)
    with pytest.raises(dfp.InvalidArgumentError, match="layer kind 'softmax' is not one of dfp's"):
        a.layer("softmax", 0)
    with pytest.raises(TypeError, match="parameter 'size': expected a number or a bool, got a str"):
        a.layer("lrn", 0, size="5")
    with pytest.raises(TypeError, match="inputs: expected a node or a list of nodes"):
        a.layer("relu", "x")
    with pytest.raises(TypeError, match="inputs: expected nodes"):
        a.layer("relu", [0.5])


def test_precision_policy_object():
    p = dfp.PrecisionPolicy(precision="int16", overrides={"conv1": "fp32"}, rounding="stochastic", weights_headroom=4)
    assert p.precision == "int16"
    assert p.overrides == [("conv1", "fp32")]
    assert p.resolve("conv1") == "fp32" and p.resolve("conv2") == "int16"
    assert p.activations_rounding == "stochastic" and p.weights_headroom == 4 and p.gradients_headroom == 2
    with pytest.raises(dfp.InvalidArgumentError, match="int8"):
        dfp.PrecisionPolicy(precision="int8")
    with pytest.raises(TypeError, match="precisoin"):
        dfp.PrecisionPolicy(precisoin="int16")
    with pytest.raises(dfp.Error, match="biased"):
        dfp.PrecisionPolicy(precision="bf16", rounding="biased")


def test_fp8_policy_settings_and_numerics(ctx):
    p = dfp.PrecisionPolicy(precision="fp8", fp8_scaling="current", fp8_margin=1)
    assert (p.fp8_scaling, p.fp8_amax_history, p.fp8_margin, p.fp8_overflow) == ("current", 1024, 1, "saturate")
    assert "fp8{current,1024,1,saturate}" in p.describe()
    with pytest.raises(dfp.InvalidArgumentError, match="unknown fp8 scaling 'later'"):
        p.fp8_scaling = "later"
    with pytest.raises(dfp.InvalidArgumentError, match="fp8 amax history must be 1..1048576, got 0"):
        dfp.PrecisionPolicy(precision="fp8", fp8_amax_history=0)
    with pytest.raises(dfp.InvalidArgumentError, match="unknown overflow mode 'wrap'"):
        dfp.PrecisionPolicy(precision="fp8", fp8_overflow="wrap")
    m, _ = small_model(ctx, policy=p)
    m.set_numerics_interval(1)
    x, y = random_batch(4, 3, 8, 8, 5)
    m.forward(x, y, train=True)
    m.backward()
    n = m.numerics()[0]
    assert n["format"] == "e4m3/e4m3/e5m2" and "chain_fwd" not in n
    assert n["exp_dy"] < 0 and n["sqnr_x_db"] > 20


def test_block_dfp_granularity_settings_and_numerics(ctx):
    p = dfp.PrecisionPolicy(precision="int16", granularity="block32", weights_granularity="tensor")
    assert (p.weights_granularity, p.activations_granularity, p.gradients_granularity) == ("tensor", "block32", "block32")
    assert "granularity=block32" in p.describe()
    with pytest.raises(dfp.InvalidArgumentError, match="unknown granularity 'block48'"):
        p.gradients_granularity = "block48"
    with pytest.raises(dfp.InvalidArgumentError, match="stochastic rounding has no block form"):
        dfp.PrecisionPolicy(precision="int16", granularity="block64", rounding="stochastic")
    m, _ = small_model(ctx, policy=p)
    m.set_numerics_interval(1)
    x, y = random_batch(4, 3, 8, 8, 5)
    m.forward(x, y, train=True)
    m.backward()
    n = m.numerics()[1]
    assert n["format"] == "int16" and n["chain_fwd"] == 0  # emulated: no INT32 chains
    assert n["sqnr_x_db"] > 60 and "exp_w_min" not in n  # the weights keep one exponent
    assert n["exp_x_min"] < n["exp_x"]  # the input's blocks do not


def test_build_takes_a_policy_object(ctx):
    m, _ = small_model(ctx, policy=dfp.PrecisionPolicy(precision="bf16"))
    assert "bf16" in m.summary()


def test_parameters_are_views_without_copies(ctx):
    m, _ = small_model(ctx, precision="fp32")
    p = m.parameters()[0]
    again = m.parameters()[0]
    assert p.value.dtype == np.float32 and p.value.size > 0
    assert np.shares_memory(p.value, again.value)
    x, y = random_batch(4, 3, 8, 8, 5)
    before = m.forward(x, y, train=False).loss
    fc = [q for q in m.parameters() if q.name.startswith("fc")]
    assert len(fc) == 2  # weight and bias
    for q in fc:
        q.value[:] = 0  # written through the view
    assert not any(np.any(q.value) for q in m.parameters() if q.name.startswith("fc"))
    m.weights_updated()
    after = m.forward(x, y, train=False).loss
    assert after != before
    assert abs(after - np.log(5)) < 1e-4  # zero classifier weights and biases: uniform softmax


def test_a_view_keeps_the_model_alive(ctx):
    m, _ = small_model(ctx, precision="int16")
    view = m.parameters()[0].value
    grad = m.parameters()[0].grad
    expected = view.copy()
    del m
    gc.collect()
    np.testing.assert_array_equal(view, expected)
    view += 1.0
    grad[:] = 0.0
    model = view.base  # the view's base is the model itself, still usable
    assert isinstance(model, dfp.Model) and model.name == "small"
    model.weights_updated()
    x, y = random_batch(4, 3, 8, 8, 5)
    assert np.isfinite(model.forward(x, y, train=False).loss)


def test_a_model_keeps_its_context_alive():
    m = dfp.Model(dfp.Context(threads=1), "orphan")
    x = m.input(1, 4, 4)
    m.softmax_cross_entropy(m.linear(m.flatten(x), 2))
    gc.collect()
    m.build(2)
    data, labels = random_batch(2, 1, 4, 4, 2)
    assert m.forward(data, labels).count == 2


def test_lenet_loss_falls_with_sgd_steps(ctx):
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, 10, ctx)
    m.build(32, precision="int16")
    sgd = dfp.Sgd(ctx, m, momentum=0.9, weight_decay=0.0)
    x, y = random_batch(32, 1, 28, 28, 10, seed=1)
    losses = []
    for _ in range(40):
        r = m.forward(x, y, train=True)
        losses.append(r.loss)
        assert m.backward()
        sgd.step(0.05)
    assert m.step == 40
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.7 * losses[0], losses
    assert any(np.any(p.grad) for p in m.parameters())


def test_errors_carry_the_library_message(ctx):
    m, _ = small_model(ctx)
    x, y = random_batch(4, 3, 8, 8, 5)
    with pytest.raises(dfp.InvalidArgumentError, match=r"\(count, 3, 8, 8\)"):
        m.forward(x[:, :1], y)
    with pytest.raises(dfp.InvalidArgumentError, match="labels"):
        m.forward(x, y[:2])
    with pytest.raises(dfp.Error) as info:
        dfp.Context(isa="avx9000")
    assert info.value.status == "invalid_argument" and "avx9000" in str(info.value)
    unbuilt = dfp.Model(ctx)
    with pytest.raises(dfp.InvalidArgumentError, match="not built"):
        unbuilt.parameters()
