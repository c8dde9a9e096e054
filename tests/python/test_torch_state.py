"""PyTorch state_dicts and dfp's zoo models: a torchvision model's state_dict (random init, seeded,
BatchNorm statistics of its own) loaded into the dfp model gives torchvision's FP32 logits on the
same images (largest difference within 1e-4 of the largest logit); dfp's export loads into the
torchvision model with strict=True and round-trips bit for bit; float16 files widen exactly;
foreign or hostile files are refused with dfp's message. Skipped where /usr/bin/python3 lacks
torch or torchvision."""
import collections

import numpy as np
import pytest

import dfp

torch = pytest.importorskip("torch", reason="python3-torch not installed")
torchvision = pytest.importorskip("torchvision", reason="python3-torchvision not installed")

CLASSES = 10


@pytest.fixture(scope="module")
def ctx():
    torch.set_num_threads(2)
    return dfp.Context(threads=2, seed=5)


def torchvision_model(name, size, **kwargs):
    """The torchvision model `name` (seeded random init) with running statistics from two
    training-mode batches, in eval mode."""
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(num_classes=CLASSES, **kwargs)
    m.train()
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(4, 3, size, size))
    return m.eval()


def bits(t):
    return t.detach().contiguous().view(torch.int32) if t.dtype == torch.float32 else t


# (torchvision name, dfp zoo name, input side, torchvision's arguments for the file, for the export)
# ResNet-18 runs in the default suite; the three larger ones (10-30 s each on 2 cores) carry the
# mark long (ctest python:pytest_long).
CASES = [
    ("resnet18", "resnet18", 64, {}, {}),
    pytest.param("vgg11_bn", "vgg11bn", 224, {}, {}, marks=pytest.mark.long),  # 224: features 7x7, torchvision's classifier as it is
    pytest.param("googlenet", "googlenet", 64, {"aux_logits": True, "init_weights": True},
                 {"aux_logits": False, "init_weights": True}, marks=pytest.mark.long),
    pytest.param("alexnet", "alexnet_tv", 224, {}, {}, marks=pytest.mark.long),
]


@pytest.mark.parametrize("tv_name,ours,size,tv_kwargs,export_kwargs", CASES,
                         ids=["resnet18", "vgg11_bn", "googlenet", "alexnet"])
def test_torchvision_weights_give_torchvision_logits_and_export_round_trips(
        ctx, tmp_path, tv_name, ours, size, tv_kwargs, export_kwargs):
    tv = torchvision_model(tv_name, size, **tv_kwargs)
    torch.save(tv.state_dict(), tmp_path / "tv.pt")
    m = dfp.Model.from_zoo(ours, 3, size, size, CLASSES, ctx)
    m.build(2, precision="fp32")
    report = m.load_torch_state_dict(tmp_path / "tv.pt")
    assert report["format"] == "torch"
    assert not (report["missing"] or report["unexpected"] or report["mismatched"] or report["skipped"])
    assert len(report["loaded"]) == len(m.state_dict())
    assert all(n.endswith("num_batches_tracked") or n.startswith(("aux1.", "aux2.")) for n in report["ignored"])
    if tv_name == "googlenet":
        assert any(n.startswith("aux1.") for n in report["ignored"])

    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = tv(x).numpy()
    got = m.predict(x.numpy())
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()

    m.save_torch_state_dict(tmp_path / "dfp.pt")
    back = getattr(torchvision.models, tv_name)(num_classes=CLASSES, **export_kwargs)
    back.load_state_dict(torch.load(tmp_path / "dfp.pt"), strict=True)
    original = tv.state_dict()
    for name, value in back.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            assert torch.equal(bits(value), bits(original[name])), name


def test_float16_and_bfloat16_files_widen_exactly(ctx, tmp_path):
    tv = torchvision_model("resnet18", 32)
    m = dfp.Model.from_zoo("resnet18", 3, 32, 32, CLASSES, ctx)
    m.build(1, precision="fp32")
    for dtype in (torch.float16, torch.bfloat16):
        sd = collections.OrderedDict((k, v.to(dtype) if v.is_floating_point() else v) for k, v in tv.state_dict().items())
        torch.save(sd, tmp_path / "half.pt")
        m.load_torch_state_dict(tmp_path / "half.pt")
        ours = m.state_dict()
        for name in ("conv1.weight", "layer4.1.bn2.running_var", "fc.bias"):
            np.testing.assert_array_equal(ours[name], sd[name].float().numpy())


def test_another_models_file_is_refused_naming_the_tensors(ctx, tmp_path):
    torch.save(torchvision.models.resnet18(num_classes=CLASSES).state_dict(), tmp_path / "r18.pt")
    m = dfp.Model.from_zoo("resnet34", 3, 32, 32, CLASSES, ctx)
    m.build(1, precision="fp32")
    before = m.state_dict()["conv1.weight"].copy()
    with pytest.raises(dfp.InvalidArgumentError, match=r"r18\.pt.*missing from the file: layer1\.2\.conv1\.weight"):
        m.load_torch_state_dict(tmp_path / "r18.pt")
    np.testing.assert_array_equal(m.state_dict()["conv1.weight"], before)
    report = m.load_torch_state_dict(tmp_path / "r18.pt", strict=False)
    assert "layer3.5.bn2.running_var" in report["missing"]
    np.testing.assert_array_equal(m.state_dict()["conv1.weight"],
                                  torch.load(tmp_path / "r18.pt")["conv1.weight"].numpy())


def test_fine_tuning_keeps_a_classifier_of_another_shape(ctx, tmp_path):
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), tmp_path / "imagenet.pt")
    m = dfp.Model.from_zoo("resnet18", 3, 32, 32, CLASSES, ctx)
    m.build(1, precision="int16")
    fc = m.state_dict()["fc.weight"].copy()
    report = m.load_torch_state_dict(tmp_path / "imagenet.pt", skip_mismatched_classifier=True)
    assert report["skipped"] == ["fc.weight: file 1000x512, model 10x512 (the classifier: keeps its initial values)",
                                 "fc.bias: file 1000, model 10 (the classifier: keeps its initial values)"]
    np.testing.assert_array_equal(m.state_dict()["fc.weight"], fc)


def test_files_that_are_not_state_dicts_are_refused(ctx, tmp_path):
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, CLASSES, ctx)
    m.build(1, precision="fp32")
    torch.save(m.state_dict(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(dfp.Error, match="legacy.pt.*legacy format") as info:
        m.load_torch_state_dict(tmp_path / "legacy.pt")
    assert info.value.status == "unsupported"
    torch.save({"fc.weight": torch.ones(1), "counts": collections.Counter()}, tmp_path / "global.pt")
    with pytest.raises(dfp.Error, match="global 'collections.Counter'"):
        m.load_torch_state_dict(tmp_path / "global.pt")
    torch.save({"epoch": 3, "state_dict": {"fc.weight": torch.ones(2)}}, tmp_path / "checkpoint.pt")
    with pytest.raises(dfp.Error, match="'epoch' is an int .a training checkpoint"):
        m.load_torch_state_dict(tmp_path / "checkpoint.pt")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "script.pt")
    with pytest.raises(dfp.Error, match="TorchScript"):
        m.load_torch_state_dict(tmp_path / "script.pt")



def test_training_checkpoints_are_refused_with_the_hint(ctx, tmp_path):
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, CLASSES, ctx)
    m.build(1, precision="fp32")
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(4, 2)).sum().backward()
    opt.step()
    torch.save({"epoch": 3, "model": net.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "train.pt")
    torch.save({"state_dict": net.state_dict(), "best_acc1": 0.5, "arch": "x"}, tmp_path / "best.pt")
    for name, keys, inner in [("train.pt", "'epoch', 'model', 'optimizer'", "model"),
                              ("best.pt", "'state_dict', 'best_acc1'", "state_dict")]:
        for load in (m.load_torch_state_dict, m.load_weights):
            with pytest.raises(dfp.Error) as info:
                load(tmp_path / name)
            msg = str(info.value)
            assert f"torch file '{tmp_path / name}'" in msg, msg
            assert f"the keys {keys}" in msg, msg
            assert "torch.save(model.state_dict(), path)" in msg, msg
            assert f"torch.save(checkpoint['{inner}'], path)" in msg, msg
            assert info.value.status == "unsupported"


def test_a_key_that_is_not_utf8_is_a_dfp_error(ctx, tmp_path):
    """A state_dict key of bytes that are not UTF-8 (a damaged file: Python writes str as UTF-8)
    raises dfp.Error naming the file and the key escaped, not UnicodeDecodeError."""
    import zipfile
    m = dfp.Model.from_zoo("lenet", 1, 28, 28, CLASSES, ctx)
    m.build(1, precision="fp32")
    sd = collections.OrderedDict((k, torch.from_numpy(v.copy())) for k, v in m.state_dict().items())
    sd["fc.biaZ"] = sd.pop("fc.bias")
    torch.save(sd, tmp_path / "good.pt")
    with zipfile.ZipFile(tmp_path / "good.pt") as src, zipfile.ZipFile(tmp_path / "bad.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert data.count(b"fc.biaZ") == 1
                data = data.replace(b"fc.biaZ", b"fc.bia\xff")
            dst.writestr(info, data)
    for load in (m.load_torch_state_dict, m.load_weights):
        with pytest.raises(dfp.Error, match=r"bad\.pt.*state_dict key 'fc\.bia\\xff' is not valid UTF-8") as info:
            load(tmp_path / "bad.pt", strict=False)
        assert info.value.status == "corrupt_data"
