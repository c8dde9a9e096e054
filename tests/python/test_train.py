"""dfp.train and dfp.evaluate: the CLI's configuration (TrainConfig, checked by the C++
validator), epoch metrics through a Python callback, checkpoints evaluated afterwards."""
import os

import pytest

import dfp

FASHION = "/usr/share/datasets/fashion-mnist"


def test_train_config_fields_and_validation():
    c = dfp.TrainConfig(model="lenet", epochs=2, batch_size=16, precision="int16", headroom=3)
    assert c.model == "lenet" and c.epochs == 2 and c.batch_size == 16
    assert c.policy.precision == "int16" and c.policy.weights_headroom == 3
    c.policy.precision = "bf16"  # the attribute is the config's own policy, not a copy
    assert c.policy.precision == "bf16"
    c.milestones = [3, 6]
    assert c.milestones == [3, 6]
    c.validate()
    for field, value, flag in [("epochs", 0, "epochs"), ("batch_size", 0, "batch"), ("lr", -1.0, "lr"),
                               ("schedule", "zigzag", "schedule"), ("threads", -2, "threads")]:
        bad = dfp.TrainConfig(**{field: value})
        with pytest.raises(dfp.InvalidArgumentError, match=flag) as info:
            bad.validate()
        assert info.value.status == "invalid_argument"
    with pytest.raises(dfp.InvalidArgumentError, match="epochs"):
        dfp.train(dfp.TrainConfig(epochs=-1))  # refused before any data is read
    with pytest.raises(TypeError, match="epoch_count"):
        dfp.TrainConfig(epoch_count=3)


@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"{FASHION} absent (Debian package dataset-fashion-mnist)")
def test_train_tiny_fashion_mnist_with_epoch_callback(tmp_path):
    seen, lines = [], []
    config = dfp.TrainConfig(model="lenet", epochs=2, batch_size=32, lr=0.05, limit_train=512, limit_test=128,
                             threads=2, precision="int16", out=str(tmp_path / "run"), print_every=4)
    result = dfp.train(config, callback=seen.append, log=lines.append)
    assert [m.epoch for m in seen] == [1, 2]
    assert seen == result
    m = result[-1]
    assert isinstance(m, dfp.EpochMetrics)
    assert m.train_loss > 0 and 0 <= m.test_top1 <= 100 and m.images_per_second > 0
    assert result[1].train_loss < result[0].train_loss
    assert any("epoch 2/2 done" in line for line in lines)
    r = dfp.evaluate(str(tmp_path / "run" / "checkpoint.dfp"))
    assert isinstance(r, dfp.EvalResult) and r.images == 10000  # the whole test split
    assert r.loss > 0 and 0 <= r.top1 <= r.top5 <= 100


@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"{FASHION} absent (Debian package dataset-fashion-mnist)")
def test_an_exception_in_the_callback_stops_training():
    def stop(metrics):
        raise KeyError("stop here")

    config = dfp.TrainConfig(model="lenet", epochs=3, batch_size=32, limit_train=64, limit_test=32, threads=2)
    with pytest.raises(KeyError, match="stop here"):
        dfp.train(config, callback=stop)


def test_evaluate_reports_a_missing_checkpoint(tmp_path):
    with pytest.raises(dfp.Error) as info:
        dfp.evaluate(str(tmp_path / "none.dfp"))
    assert info.value.status == "io_error" and "none.dfp" in str(info.value)


def test_train_writes_a_run_toml_that_the_program_repeats(tmp_path):
    """dfp.train writes run.toml as `dfp train` does; `dfp train --config` takes it."""
    out = tmp_path / "run"
    config = dfp.TrainConfig(model="lenet", dataset="synthetic", data="classes=10,train=16,test=8", image_size=28,
                             epochs=1, batch_size=8, threads=2, lr=0.03, out=str(out))
    dfp.train(config)
    toml = (out / "run.toml").read_text()
    assert "model = 'lenet'" in toml and "epochs = 1\n" in toml and "lr = 0.03\n" in toml
    build = os.environ.get("DFP_BUILD_DIR")
    program = os.path.join(build, "dfp") if build else None
    if not program or not os.path.isfile(program):
        pytest.skip("DFP_BUILD_DIR not set (ctest sets it): the program's half of the check")
    import subprocess
    again = tmp_path / "again"
    r = subprocess.run([program, "train", "--config", str(out / "run.toml"), "--out", str(again)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (again / "checkpoint.dfp").read_bytes() == (out / "checkpoint.dfp").read_bytes()
