"""A torchvision ResNet-18 with a CIFAR stem, converted to int16 by dfp.torch.convert, trains on
Fashion-MNIST next to the same model in PyTorch FP32 (same initial weights, data order and
optimizer): the losses track each other within stated bounds, and both learn."""
import copy
import gzip
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="/usr/bin/python3 lacks torch (Debian: apt-get install python3-torch)")
torchvision = pytest.importorskip("torchvision", reason="/usr/bin/python3 lacks torchvision (Debian: python3-torchvision)")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dfp  # noqa: E402
import dfp.torch as dt  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
IMAGES, BATCH, EPOCHS = 192, 32, 2


def idx(path):
    """An IDX array (the MNIST file format) from its .gz file."""
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def resnet18c():
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)  # CIFAR stem: 3x3, stride 1, no max-pool
    m.maxpool = nn.Identity()
    return m


def train(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    losses = []
    for _ in range(EPOCHS):
        for i in range(0, IMAGES, BATCH):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.mark.long  # about 45 s on 2 cores: ctest python:pytest_long
@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"{FASHION} absent (Debian package dataset-fashion-mnist)")
def test_resnet18c_int16_trains_like_fp32():
    torch.set_num_threads(2)
    images = idx(f"{FASHION}/train-images-idx3-ubyte.gz")[:IMAGES].astype(np.float32) / 255
    x = torch.from_numpy((images - 0.2860) / 0.3530).unsqueeze(1)  # Fashion-MNIST's mean and deviation
    y = torch.from_numpy(idx(f"{FASHION}/train-labels-idx1-ubyte.gz")[:IMAGES].astype(np.int64))
    torch.manual_seed(0)
    fp32 = resnet18c()
    int16 = copy.deepcopy(fp32)
    assert len(dt.convert(int16, "int16", ctx=dfp.Context(threads=2))) == 21  # 20 convs and fc
    a, b = train(int16, x, y), train(fp32, x, y)
    diff = [abs(u - v) for u, v in zip(a, b)]
    steps = IMAGES // BATCH
    # The first step's losses differ only by DFP16's rounding of the forward operands (13 bits of
    # each tensor's largest magnitude): measured 1e-4.
    assert diff[0] <= 1e-2, (a, b)
    # Then the runs separate as two runs of any nonconvex training do (measured: at most 0.06 per
    # step over these 12 steps, up to 0.12 over 24 on a loss of ~2): each step within 0.25, and
    # the last epoch's mean within 0.1.
    assert max(diff) <= 0.25, (a, b)
    assert abs(np.mean(a[-steps:]) - np.mean(b[-steps:])) <= 0.1, (a, b)
    # Both learn: the second epoch's mean loss is below the first's.
    for run in (a, b):
        assert np.mean(run[-steps:]) < np.mean(run[:steps]) - 0.1, run
    n = dt.numerics(int16)
    assert set(n) == {name for name, _ in dt.dfp_layers(int16)}
    assert all(r["format"] == "int16" and r["overflow_events"] == 0 for r in n.values())
