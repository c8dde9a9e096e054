"""dfp.torch.optim.SGD: torch.optim.SGD's update in dfp's kernel, against torch.optim.SGD itself
(plain torch parameters, groups, state carried between the two, the parameters it leaves to torch);
with a compiled module or segments, whose parameters view dfp's master weights: trained as with
torch's optimizer, no weight copies, and weights re-quantized from the update's maxima exactly as
from a pass of their own; refusals."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="dfp.torch needs torch (Debian: python3-torch)")
pytest.importorskip("torchvision", reason="the segment tests use torchvision's BasicBlock")
import torch.nn.functional as F

import dfp
import dfp.torch as dt
from test_torch_compile import ctx, rel  # noqa: F401 (ctx: the fixture)
from test_torch_segments import Net

# dfp's update against torch's for the same gradients: the same operations per value, which torch
# may fuse differently (a multiply-add), so a few units in the last place.
ULP_REL = 1e-6


def batch(n=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def grads_of(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


@pytest.mark.parametrize("kw", [dict(momentum=0.9, weight_decay=5e-4), dict(momentum=0.9, nesterov=True),
                                dict(momentum=0.0, weight_decay=1e-3), dict()])
def test_update_is_torchs(ctx, kw):
    a = Net()
    b = copy.deepcopy(a)
    groups = lambda m: [{"params": [p for n, p in m.named_parameters() if n.startswith("fc")], "lr": 0.2},
                        {"params": [p for n, p in m.named_parameters() if not n.startswith("fc")]}]
    oa = torch.optim.SGD(groups(a), lr=0.05, **kw)
    ob = dt.optim.SGD(groups(b), lr=0.05, ctx=ctx, **kw)
    for s in range(3):
        x, y = batch(seed=s)
        grads_of(a, x, y)
        for p, q in zip(a.parameters(), b.parameters()):
            q.grad = p.grad.clone()
        b.bn1.weight.grad = None  # a parameter without a gradient is left alone by both
        a.bn1.weight.grad = None
        oa.step()
        ob.step()
        for (n, p), q in zip(a.named_parameters(), b.parameters()):
            assert rel(q, p) <= ULP_REL, f"step {s}: {n}"
    # The state moves to torch's SGD and on from there as torch's own.
    oc = torch.optim.SGD(groups(b), lr=0.05, **kw)
    oc.load_state_dict(ob.state_dict())
    x, y = batch(seed=9)
    grads_of(a, x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        q.grad = p.grad.clone()
    oa.step()
    oc.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert rel(q, p) <= ULP_REL, f"after load_state_dict: {n}"


def test_parameters_dfp_cannot_update_in_place_go_to_torch(ctx):
    a = torch.nn.Linear(6, 4).double()
    b = copy.deepcopy(a)
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    ob = dt.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, ctx=ctx)
    for _ in range(2):
        x = torch.randn(3, 6, dtype=torch.float64)
        for m in (a, b):
            m.zero_grad()
            m(x).square().sum().backward()
        oa.step()
        ob.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
        assert q.dtype == torch.float64


def test_refusals_name_the_argument(ctx):
    p = [torch.nn.Parameter(torch.ones(3))]
    for kw, word in [(dict(lr=-1), "lr"), (dict(lr=0.1, dampening=0.1), "dampening"),
                     (dict(lr=0.1, maximize=True), "maximize"), (dict(lr=0.1, nesterov=True), "nesterov"),
                     (dict(lr=0.1, momentum=-0.5), "momentum"), (dict(lr=0.1, weight_decay=-1), "weight_decay")]:
        with pytest.raises(ValueError, match=word):
            dt.optim.SGD(p, **kw)
    w, g, v = np.ones(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(dfp.InvalidArgumentError, match=r"values\[0\].*float32"):
        dfp.sgd_update(ctx, [np.ones(4)], [g], [v], 0.1)
    with pytest.raises(dfp.InvalidArgumentError, match=r"velocities\[0\].*C-contiguous"):
        dfp.sgd_update(ctx, [w], [g], [np.zeros(8, np.float32)[::2]], 0.1)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(dfp.InvalidArgumentError, match=r"velocities\[0\].*writable"):
        dfp.sgd_update(ctx, [w], [g], [ro], 0.1)
    with pytest.raises(dfp.InvalidArgumentError, match="tensor 0: 4 values, 3 gradients"):
        dfp.sgd_update(ctx, [w], [np.ones(3, np.float32)], [v], 0.1)
    with pytest.raises(dfp.InvalidArgumentError, match="1 values, 2 gradients"):
        dfp.sgd_update(ctx, [w], [g, g], [v], 0.1)
    with pytest.raises(dfp.InvalidArgumentError, match="lr: expected a finite"):
        dfp.sgd_update(ctx, [w], [g], [v], float("nan"))
    assert np.array_equal(w, np.ones(4, np.float32))  # nothing was touched by a refused call
    # One large tensor is cut between the threads: its maximum is still its own.
    big = np.linspace(-3, 2, 300001, dtype=np.float32)
    m = dfp.sgd_update(ctx, [big, w], [np.zeros_like(big), g], [np.zeros_like(big), v], 0.5)
    assert m == [np.float32(3.0), np.float32(0.5)]
    big[123456] = np.nan
    assert np.isnan(dfp.sgd_update(ctx, [big], [np.zeros_like(big)], [np.zeros_like(big)], 0.5)[0])


def test_compiled_module_trains_as_with_torchs_sgd_without_copies(ctx):
    x, y = batch()
    a = dt.compile(Net(), x, precision="fp32", ctx=ctx)
    b = dt.compile(Net(), x, precision="fp32", ctx=ctx)
    # The parameters are views of dfp's master weights after compile's one copy.
    state = b.dfp_model.state()
    for n, p in b.module.named_parameters():
        assert p.data_ptr() == state[n].value.ctypes.data, n
    copies = b.weight_copies
    oa = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    ob = dt.optim.SGD(b.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, ctx=ctx)
    for s in range(3):
        x, y = batch(seed=s)
        la, lb = (F.cross_entropy(m(x), y) for m in (a, b))
        assert abs(float(la) - float(lb)) <= 1e-5 * abs(float(la)), f"step {s}"
        for m, o, loss in ((a, oa, la), (b, ob, lb)):
            o.zero_grad(set_to_none=True)
            loss.backward()
            o.step()
    assert b.weight_copies == copies  # no parameter copied again, no buffer copied back in
    assert b.weight_syncs == 4  # compile's and one re-quantization per optimizer step
    for (n, p), q in zip(a.module.named_parameters(), b.module.parameters()):
        assert rel(q, p) <= 1e-5, n


def test_int16_weights_from_the_update_maxima_are_the_measured_ones(ctx):
    """The re-quantization after dfp.torch.optim.SGD takes each weight's DFP16 exponent from the
    maxima of the update pass; a re-quantization that measures them itself gives the same bits."""
    x, y = batch()
    c = dt.compile(Net(), x, precision="int16", ctx=ctx)
    opt = dt.optim.SGD(c.parameters(), lr=0.5, momentum=0.9, ctx=ctx)
    for s in range(2):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(c(x), y).backward()
        opt.step()
    c.eval()
    before = c(x)
    dt.weights_updated(c)  # forget: the next call re-quantizes, measuring max|w| itself
    after = c(x)
    assert torch.equal(before, after)
    # A write torch's version counter does not see lands in dfp's weights (the parameters view
    # them) and is quantized after weights_updated.
    with torch.no_grad():
        c.module.fc.weight.data[:] = 0
        c.module.fc.bias.data[:] = 1
    dt.weights_updated(c)
    assert torch.equal(c(x), torch.ones(8, 10))


def test_segments_train_as_with_torchs_sgd_across_batch_sizes(ctx):
    """Segments keep a dfp Model per batch size: the parameters view one of them, the other
    copies them when the optimizer has moved them."""
    x, _ = batch()
    a, b = Net(), Net()
    for m in (a, b):
        dt.convert(m, precision="fp32", ctx=ctx, example_input=x)
    assert any(isinstance(m, dt.Segment) for m in b.modules())
    oa = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    ob = dt.optim.SGD(b.parameters(), lr=0.05, momentum=0.9, ctx=ctx)
    for s, n in enumerate([8, 8, 5, 8, 5]):
        x, y = batch(n, seed=s)
        la, lb = (F.cross_entropy(m(x), y) for m in (a, b))
        assert abs(float(la) - float(lb)) <= 1e-5 * abs(float(la)), f"step {s} (batch {n})"
        for o, loss in ((oa, la), (ob, lb)):
            o.zero_grad(set_to_none=True)
            loss.backward()
            o.step()
    a.eval()
    b.eval()
    assert rel(b(x), a(x)) <= 1e-5
