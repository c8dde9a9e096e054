"""dfp.torch.compile: a torch model traced with torch.fx and run as one dfp Model, against torch
itself (FP32: loss, logits, every gradient, the BatchNorm statistics and an optimizer step) and
against dfp's own zoo model with the same weights; weights re-copied once per change of version;
unsupported nodes named."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="dfp.torch needs torch (Debian: python3-torch)")
torchvision = pytest.importorskip("torchvision", reason="these tests use torchvision's ResNet-18")
import torch.nn as nn
import torch.nn.functional as F

import dfp
import dfp.torch as dt

REL = 1e-4  # dfp FP32 against torch in float64, relative L2 (measured ~3e-6 on ResNet-18)
KINK = 5e-4  # the margin kept between a ReLU's input and its kink (float32 strays by up to ~2e-5 there)


@pytest.fixture(scope="module")
def ctx():
    return dfp.Context(threads=2, seed=5)


def rel(a, b):
    a, b = (np.asarray(t.detach() if torch.is_tensor(t) else t, np.float64) for t in (a, b))
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def resnet18c(classes=10):
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


def clear_of_kinks(model, x):
    """Shifts the BatchNorm biases of a torchvision ResNet-18 so that, on the images x, no ReLU
    input lies within KINK of 0, channel by channel in forward order (each ReLU follows a
    BatchNorm, or a residual add after one, so a bias shifts the ReLU's input of its channel by the
    same amount); each channel's shift is the smallest that puts [-KINK, KINK] into a gap between its
    values. Returns the largest shift. The running statistics are kept."""
    blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
    feeding = [model.bn1] + [bn for b in blocks for bn in (b.bn1, b.bn2)]  # in the ReLUs' call order
    calls, shifts = [], []

    def hook(_, args):
        v = args[0]
        bn = feeding[len(calls)]
        calls.append(bn)
        s = v.detach().transpose(0, 1).reshape(v.shape[1], -1).sort(dim=1).values  # (C, values)
        inf = torch.full_like(s[:, :1], float("inf"))
        lo, hi = torch.cat([-inf, s], 1), torch.cat([s, inf], 1)  # the gaps between the values
        # The smallest shift that puts [-KINK, KINK] inside a gap (lo + d <= -KINK, hi + d >= KINK).
        d = torch.clamp(torch.zeros_like(lo), min=KINK - hi, max=-KINK - lo)
        d = torch.where(hi - lo >= 2 * KINK, d, inf)
        d = d.gather(1, d.abs().argmin(1, keepdim=True)).squeeze(1)
        with torch.no_grad():
            bn.bias += d.to(bn.bias.dtype)
        shifts.append(float(d.abs().max()))
        return (v + d.to(v.dtype).view(1, -1, 1, 1),)

    hooks = [r.register_forward_pre_hook(hook) for r in {model.relu, *(b.relu for b in blocks)}]
    buffers = [b.clone() for b in model.buffers()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for b, saved in zip(model.buffers(), buffers):
                b.copy_(saved)
    assert len(calls) == len(feeding)
    return max(shifts)


def step(model, x, y, opt):
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    return out.detach(), float(loss)


def test_resnet18_fp32_trains_as_torch_does(ctx):
    """Three SGD steps of the compiled module, each against the same torch module in float64 at
    the compiled module's weights: the loss, the logits, every gradient and (after a fourth
    forward) the BatchNorm statistics.

    A ReLU's gradient jumps at its kink: an input within float32's rounding of 0 (one in a million
    here, about 1e-8 from 0) passes its gradient in one computation and not in the other, which
    moves the first layers' gradients by ~1e-2 on some CPUs' summation order (torch's own float32
    among them), and a trajectory of steps carries that into every later gradient. So each step is
    compared at one set of weights, whose BatchNorm biases are first shifted by under 1e-2 to keep
    every ReLU input at least KINK from 0 (clear_of_kinks; float32 strays from float64 by ~2e-5
    there): the gradient is then continuous around both computations and the bound holds on every
    CPU."""
    mine = resnet18c()
    ref = copy.deepcopy(mine).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    compiled = dt.compile(mine, x, precision="fp32", ctx=ctx)
    assert compiled.weight_syncs == 1
    opt = torch.optim.SGD(compiled.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def at_mine():  # ref's parameters := mine's (its running statistics are its own)
        with torch.no_grad():
            for p, q in zip(ref.parameters(), mine.parameters()):
                p.copy_(q)

    for s in range(3):
        at_mine()
        assert clear_of_kinks(ref, x.double()) < 1e-2
        with torch.no_grad():
            for p, q in zip(ref.parameters(), mine.parameters()):
                q.copy_(p)  # the shifted biases to the compiled module (a new version: synced)
        at_mine()  # the same float32-representable weights on both sides
        ref.zero_grad(set_to_none=True)
        out_ref = ref(x.double())
        loss_ref = F.cross_entropy(out_ref, y)
        loss_ref.backward()
        out, loss = step(compiled, x, y, opt)
        assert abs(loss - float(loss_ref)) <= REL * abs(float(loss_ref)), f"step {s}"
        assert rel(out, out_ref) <= REL, f"step {s}"
        for (n, p), (_, q) in zip(mine.named_parameters(), ref.named_parameters()):
            assert rel(p.grad, q.grad) <= REL, f"step {s}: gradient of {n}"
    # One copy into dfp per forward that follows changes (the bias shifts before the first three
    # forwards, the optimizer's steps before the last three: one copy where both changed), and
    # the first copy was compile's.
    at_mine()
    compiled(x)
    ref(x.double())  # the same fourth update of the running statistics
    assert compiled.weight_syncs == 5
    for (n, b), (_, c) in zip(mine.named_buffers(), ref.named_buffers()):
        if n.endswith("num_batches_tracked"):
            assert int(b) == int(c) == 4
        else:
            assert rel(b, c) <= REL, n
    # Evaluation: running statistics, any number of images.
    compiled.eval()
    ref.eval()
    xe = torch.randn(11, 3, 16, 16, generator=g)
    assert rel(compiled(xe), ref(xe.double())) <= REL


def test_compile_equals_the_zoo_model(ctx):
    """The traced torchvision ResNet-18 (CIFAR stem) becomes the same network as dfp's resnet18c:
    with the same weights, the same logits and gradients (up to the order of additions in the
    residual adds' gradient)."""
    tm = resnet18c()
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    compiled = dt.compile(tm, x, precision="fp32", ctx=ctx)
    zoo = dfp.Model.from_zoo("resnet18c", 3, 16, 16, 10, ctx)
    zoo.build(4, precision="fp32")
    zoo.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()
                         if not k.endswith("num_batches_tracked")})
    images = x.numpy()
    assert rel(compiled.dfp_model.predict(images), zoo.predict(images)) <= 1e-6
    z1 = compiled.dfp_model.logits(images, train=True)
    z2 = zoo.logits(images, train=True)
    assert rel(z1, z2) <= 1e-6
    gz = np.full_like(z1, 0.01)
    compiled.dfp_model.backward(gz)
    zoo.backward(gz)
    a, b = compiled.dfp_model.state(), zoo.state()
    for n, t in a.items():
        if t.grad is not None:
            assert rel(t.grad, b[n].grad) <= 1e-5, n


@pytest.mark.parametrize("precision", ["int16", "bf16", "fp16"])
def test_reduced_precisions_track_float64(ctx, precision):
    """A small conv-BN-ReLU network (well conditioned: on a randomly initialised ResNet-18 even
    torch's own float32 gradients stray by 1e-2 from float64 in the first layers): the loss within
    1e-3 and the gradient's direction within the tolerance table's INT16 network bound (cosine
    0.99; measured 0.9998 int16, 0.998 bf16, 0.9999 fp16)."""
    torch.manual_seed(0)

    def block(ci, co, s):
        return [nn.Conv2d(ci, co, 3, s, 1, bias=False), nn.BatchNorm2d(co), nn.ReLU()]

    tm = nn.Sequential(*block(3, 32, 1), *block(32, 64, 2), *block(64, 64, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                       nn.Linear(64, 10))
    x = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(4))
    ref = copy.deepcopy(tm).double()
    lref = F.cross_entropy(ref(x.double()), y)
    lref.backward()
    low = dt.compile(copy.deepcopy(tm), x, precision=precision, ctx=ctx)
    low.dfp_model.set_numerics_interval(1)
    llow = F.cross_entropy(low(x), y)
    assert abs(float(llow) - float(lref)) <= 1e-3 * float(lref)
    llow.backward()
    # numerics(): every reduced-precision layer as a layer of metrics.jsonl has it, sampled.
    records = low.numerics()
    assert len(records) == 4 and all(r["format"] == precision for r in records), records
    for r in records:
        assert ("exp_x" in r) == (precision == "int16"), r
        assert r["sqnr_dy_db"] > 20 and r["nonzero_dy"] > 0, r
        assert r["underflow"] == r["underflow_x"] + r["underflow_w"] + r["underflow_dy"], r
        assert r["nonzero"] == r["nonzero_x"] + r["nonzero_w"] + r["nonzero_dy"], r
    g = torch.cat([p.grad.flatten() for p in low.parameters()]).double()
    gref = torch.cat([p.grad.flatten() for p in ref.parameters()])
    cos = float(torch.dot(g, gref) / (g.norm() * gref.norm()))
    assert cos >= 0.99, cos
    assert low.dfp_model.policy.precision == precision


def test_input_gradient(ctx):
    torch.manual_seed(0)
    tm = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    x = torch.randn(2, 3, 8, 8)
    compiled = dt.compile(copy.deepcopy(tm), x, precision="fp32", ctx=ctx, input_grad=True)
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    compiled(xa).square().sum().backward()
    tm(xb).square().sum().backward()
    assert rel(xa.grad, xb.grad) <= REL
    plain = dt.compile(copy.deepcopy(tm), x, precision="fp32", ctx=ctx)
    with pytest.raises(ValueError, match="input_grad=True"):
        plain(x.clone().requires_grad_(True))


def test_functional_forms_and_concat(ctx):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.b = nn.Conv2d(3, 8, 1)
            self.bn = nn.BatchNorm2d(16)
            self.fc = nn.Linear(16 * 4 * 4, 5)

        def forward(self, x):
            y = torch.cat([F.relu(self.a(x)), self.b(x).relu()], 1)
            y = F.max_pool2d(self.bn(y), 2)
            y = F.avg_pool2d(y, 2, 2)
            y = F.dropout(y, 0.0, self.training)
            return self.fc(y.view(y.size(0), -1))

    torch.manual_seed(1)
    net = Net()
    x = torch.randn(4, 3, 16, 16)
    compiled = dt.compile(copy.deepcopy(net), x, precision="fp32", ctx=ctx)
    compiled.eval()
    net.eval()
    assert rel(compiled(x), net(x)) <= REL


def test_a_module_named_in_the_layer_registry_compiles_from_its_row(ctx):
    """LocalResponseNorm has no code of its own in dfp.torch: its registry row names the torch.nn
    module and the attributes holding its parameters. Forward and input gradient match torch."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.LocalResponseNorm(3, alpha=1e-2, beta=0.75, k=2.0),
                        nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    x = torch.randn(2, 3, 6, 6)
    compiled = dt.compile(copy.deepcopy(net), x, precision="fp32", ctx=ctx, input_grad=True)
    assert "lrn" in compiled.dfp_model.summary()
    xd, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yd, yt = compiled(xd), net(xt)
    assert rel(yd, yt) <= REL
    yd.sum().backward()
    yt.sum().backward()
    assert rel(xd.grad, xt.grad) <= REL
    # An attribute the row cannot take is named.
    odd = nn.LocalResponseNorm(3)
    odd.alpha = torch.tensor(1e-4)  # torch's forward takes it; dfp's row takes a number
    with pytest.raises(dt.UnsupportedError, match="LocalResponseNorm .*alpha is tensor.*dfp's lrn takes a float"):
        dt.compile(nn.Sequential(odd), torch.randn(2, 3, 4, 4), ctx=ctx)


def test_unsupported_nodes_are_named(ctx):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, dilation=2)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            x = torch.sigmoid(self.conv(x))
            return self.fc(x.mean((2, 3)))

    with pytest.raises(dt.UnsupportedError) as e:
        dt.compile(Odd(), torch.randn(2, 3, 12, 12), ctx=ctx)
    text = str(e.value)
    assert "dilation" in text and "sigmoid" in text and "mean" in text


def test_training_batch_must_be_the_traced_one(ctx):
    tm = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    compiled = dt.compile(tm, torch.randn(4, 3, 2, 2), ctx=ctx)
    with pytest.raises(ValueError, match="compiled for 4"):
        compiled(torch.randn(3, 3, 2, 2))
    compiled.eval()
    assert compiled(torch.randn(9, 3, 2, 2)).shape == (9, 3)
