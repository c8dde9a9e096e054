"""dfp.torch.convert(model, example_input=x): the blocks dfp runs whole become segments (one dfp
Model each, its BatchNorm, ReLU and adds in dfp, the blocked layout kept between its layers),
against torch itself in FP32 (outputs, every gradient, BatchNorm statistics), with the module's
names, parameters and indexing kept; INT16 training, numerics, other batch sizes, copies; and
where a block stays layer by layer (keep_fp32 inside it, a node dfp has no layer for)."""
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="dfp.torch needs torch (Debian: python3-torch)")
torchvision = pytest.importorskip("torchvision", reason="these tests use torchvision's BasicBlock")
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock

import dfp.torch as dt
from test_torch_compile import ctx, rel  # noqa: F401 (ctx: the fixture)


class Net(nn.Module):
    """A small ResNet: a stem left to the per-layer conversion, two stages of BasicBlocks (the
    second with a strided downsample), pooling and a classifier."""

    def __init__(self, mid=None):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2, down))
        self.mid = mid or nn.Identity()
        self.fc = nn.Linear(32, 10)
        for m in self.modules():  # BatchNorm away from its defaults, so a missed copy shows
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.2, 0.2)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.mid(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


class Branch(nn.Module):
    """Control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 1)

    def forward(self, x):
        return self.conv(x) if x.sum() > 0 else x


def test_blocks_run_whole_in_dfp_as_torch_does_in_fp32(ctx):
    x = torch.randn(8, 3, 12, 12)
    ref, m = Net(), Net()
    keys = list(m.state_dict().keys())
    params = dict(m.named_parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # made before the conversion
    names = dt.convert(m, "fp32", ctx=ctx, example_input=x)
    assert names == ["conv1", "layer1", "layer2", "fc"]
    assert isinstance(m.layer1, dt.Segment) and isinstance(m.layer2, dt.Segment)
    assert isinstance(m.conv1, dt.Conv2d) and isinstance(m.fc, dt.Linear)
    # The same names and the same Parameter objects; the block's indexing and length.
    assert list(m.state_dict().keys()) == keys
    assert all(p is params[n] for n, p in m.named_parameters())
    assert isinstance(m.layer1[1], BasicBlock) and len(m.layer1) == 2 and m.layer2[0].downsample[1].eps == 1e-5
    for step in range(2):
        y, yr = m(x), ref(x)
        assert y.shape == yr.shape and rel(y, yr) < 1e-5, step
        F.cross_entropy(y, torch.arange(8) % 10).backward()
        F.cross_entropy(yr, torch.arange(8) % 10).backward()
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            assert rel(p.grad, q.grad) < 1e-4, (step, n)
        for (n, b), (_, c) in zip(m.named_buffers(), ref.named_buffers()):
            assert rel(b, c) < 1e-5, (step, n)  # running statistics and num_batches_tracked
        opt.step()
        opt.zero_grad()
        with torch.no_grad():  # torch's copy takes the same update
            for p, q in zip(m.parameters(), ref.parameters()):
                q.copy_(p)
                q.grad = None
    # Eval: running statistics, any batch size (also one the segments were not planned for).
    m.eval(), ref.eval()
    for n in (1, 3, 11):
        assert rel(m(x[:1].repeat(n, 1, 1, 1)), ref(x[:1].repeat(n, 1, 1, 1))) < 1e-5


def test_int16_segments_train_report_numerics_and_copy(ctx):
    x, labels = torch.randn(8, 3, 12, 12), torch.arange(8) % 10
    m = Net()
    dt.convert(m, "int16", ctx=ctx, example_input=x)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    dt.set_numerics_interval(m, 1)
    losses = []
    for _ in range(12):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    rec = dt.numerics(m)
    # The segments' layers by their module names, beside the per-layer ones.
    for name in ("conv1", "layer1.0.conv1", "layer1.1.conv2", "layer2.0.downsample.0", "fc"):
        assert name in rec and rec[name]["format"].startswith("int16"), name
    assert np.isfinite(rec["layer2.0.conv2"]["sqnr_dy_db"])
    # Another training batch size (the last batch of an epoch without drop_last) plans again.
    F.cross_entropy(m(x[:5]), labels[:5]).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    # Copies and pickles keep the weights and plan their dfp Models anew.
    m.eval()
    want = m(x)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert isinstance(other.layer1, dt.Segment)
        assert torch.equal(other(x), want)
        other.layer1[0].conv1.weight.data.zero_()  # its own parameters, not m's
        assert m.layer1[0].conv1.weight.abs().sum() > 0


def test_blocks_dfp_cannot_run_whole_stay_layer_by_layer(ctx):
    x = torch.randn(4, 3, 12, 12)
    # keep_fp32 inside a block: the block is searched for smaller blocks.
    m = Net()
    names = dt.convert(m, "int16", ["layer1.1.conv2"], ctx=ctx, example_input=x)
    assert "layer1" not in names and "layer1.0" in names and "layer1.1.conv1" in names
    assert type(m.layer1[1].conv2) is nn.Conv2d
    assert isinstance(m.layer1[0], dt.Segment) and isinstance(m.layer2, dt.Segment)
    # A node with no dfp layer (torch.sigmoid) in a block: its layers convert one by one.
    m = Net(mid=nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1), Sigmoid()))
    names = dt.convert(m, "int16", ctx=ctx, example_input=x)
    assert "mid" not in names and "mid.0" in names and isinstance(m.mid[0], dt.Conv2d)
    y = m(x)
    y.sum().backward()
    assert torch.isfinite(m.mid[0].weight.grad).all()
    # A block torch.fx cannot trace: its layers convert one by one.
    m = Net(mid=nn.Sequential(Branch()))
    names = dt.convert(m, "int16", ctx=ctx, example_input=x)
    assert "mid.0.conv" in names and isinstance(m.mid[0].conv, dt.Conv2d)
    # A block that takes the images (VGG's features) is planned without the input gradient.
    v = nn.Sequential(nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2)),
                      nn.Flatten(), nn.Linear(16 * 6 * 6, 10))
    assert dt.convert(v, "int16", ctx=ctx, example_input=x) == ["0", "2"]
    F.cross_entropy(v(x), torch.arange(4)).backward()
    assert list(v[0]._dfp_plans) == [(4, False)] and torch.isfinite(v[0][0].weight.grad).all()
    # Bad inputs name what was expected.
    with pytest.raises(ValueError, match=r"example_input of shape \(3, 12, 12\)"):
        dt.convert(Net(), "int16", ctx=ctx, example_input=x[0])
    with pytest.raises(ValueError, match=r"segment 'layer1': input of shape \(4, 16, 10, 10\)"):
        m.layer1(torch.randn(4, 16, 10, 10))
