"""Foundation: the size switch, device choice, the data sources and the resumable loader."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from course_utils import data, env
from course_utils.models import build_model, count_parameters


def test_fast_switch(monkeypatch):
    monkeypatch.setenv("COURSE_FAST", "1")
    assert env.is_fast() and env.by_size(100, 5) == 5
    monkeypatch.setenv("COURSE_FAST", "0")
    assert not env.is_fast() and env.by_size(100, 5) == 100


def test_pick_device_and_table():
    dev = env.pick_device()
    assert dev.type in ("cuda", "mps", "cpu")
    assert env.pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            env.pick_device("cuda")
    table = env.environment_table(torch.device("cpu"))
    for key in ("python", "torch", "device", "bf16", "CPU threads"):
        assert key in table


def test_synthetic_is_deterministic_and_shaped(capsys):
    ds = data.load_cifar10(train=True, root="/nonexistent")
    assert "合成" in capsys.readouterr().out
    assert ds.source == "synthetic" and len(ds) == 5000  # COURSE_FAST size
    assert ds.data.dtype == np.uint8 and ds.data.shape == (5000, 32, 32, 3)
    assert np.bincount(ds.targets, minlength=10).tolist() == [500] * 10
    assert ds.classes == list(data.CLASSES)
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)
    again = data.synthetic_cifar10.__wrapped__(5000, seed=1)
    assert np.array_equal(again[0], ds.data) and again[1] == ds.targets
    other = data.synthetic_cifar10.__wrapped__(5000, seed=7)
    assert not np.array_equal(other[0], ds.data)
    test = data.load_cifar10(train=False, root="/nonexistent", quiet=True)
    assert len(test) == 1000 and not np.array_equal(test.data[:10], ds.data[:10])


def test_the_stand_in_is_cached_under_the_data_root_and_a_damaged_cache_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_FAST", "1")
    first = data.load_cifar10(train=False, root=tmp_path, quiet=True)
    (cached,) = (tmp_path / data.SYNTHETIC_CACHE).iterdir()
    expected, labels = data.synthetic_cifar10(1000, seed=2)
    assert np.array_equal(first.data, expected) and first.targets == labels

    def no_generation(n, seed=1):
        raise AssertionError("the cache was not read")
    with monkeypatch.context() as m:
        m.setattr(data, "synthetic_cifar10", no_generation)
        again = data.load_cifar10(train=False, root=tmp_path, quiet=True)
    assert np.array_equal(again.data, expected) and again.targets == labels and type(again.targets[0]) is int

    good = cached.read_bytes()
    wrong_labels = tmp_path / "wrong.npz"
    np.savez(wrong_labels, images=expected, labels=np.zeros(1000, dtype=np.int64))
    objects = tmp_path / "objects.npz"
    np.savez(objects, images=np.array([None] * 3, dtype=object), labels=np.arange(3))
    for damaged in (good[: len(good) // 2], b"", wrong_labels.read_bytes(), objects.read_bytes()):
        cached.write_bytes(damaged)
        loaded = data.load_cifar10(train=False, root=tmp_path, quiet=True)
        assert np.array_equal(loaded.data, expected) and loaded.targets == labels
        assert cached.read_bytes() == good  # replaced by a good copy

    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    try:
        if not os.access(readonly, os.W_OK):  # root may write anyway
            loaded = data.load_cifar10(train=False, root=readonly, quiet=True)
            assert np.array_equal(loaded.data, expected) and not any(readonly.iterdir())
    finally:
        readonly.chmod(0o755)


def test_synthetic_is_learnable_but_not_trivial():
    torch.manual_seed(0)
    train = data.load_cifar10(True, root="/nonexistent", quiet=True)
    test = data.load_cifar10(False, root="/nonexistent", quiet=True)
    model = build_model("small", width=16)
    opt = torch.optim.AdamW(model.parameters(), 3e-3)
    for epoch in range(2):
        for x, y in data.make_loader(train, 64, epoch=epoch):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in data.make_loader(test, 500, shuffle=False))
    acc = correct / len(test)
    assert 0.25 < acc < 0.95, acc  # well above chance (0.1), not solved


def test_real_cifar_from_disk(tmp_path, monkeypatch, capsys):
    folder = tmp_path / data.CIFAR_FOLDER
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", 4) for i in range(1, 6)] + [("test_batch", 3)]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(data.CLASSES)}, f)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    train = data.load_cifar10(train=True)
    assert train.source == "cifar10" and len(train) == 20 and "真实" in capsys.readouterr().out
    test = data.load_cifar10(train=False)
    assert test.source == "cifar10" and len(test) == 3
    # CHW rows of the pickle become HWC images, exactly like torchvision
    with open(folder / "test_batch", "rb") as f:
        raw = pickle.load(f)["data"][0].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(test.data[0], raw)
    # real data that is present but unreadable is an error naming the file, never a silent switch to the stand-in
    (folder / "test_batch").write_bytes(b"garbage")
    with pytest.raises(data.UnreadableDataError, match="test_batch"):
        data.load_cifar10(train=False)


def test_take_fraction_is_balanced_and_seeded():
    ds = data.load_cifar10(True, root="/nonexistent", quiet=True)
    small = data.take_fraction(ds, 0.05, seed=3)
    assert len(small) == 250 and np.bincount(small.targets).tolist() == [25] * 10
    assert np.array_equal(small.data, data.take_fraction(ds, 0.05, seed=3).data)
    assert not np.array_equal(small.data, data.take_fraction(ds, 0.05, seed=4).data)
    with pytest.raises(ValueError, match="fraction"):
        data.take_fraction(ds, 0)


@pytest.mark.parametrize("mode", ["random", "systematic"])
def test_corrupt_labels(mode):
    ds = data.load_cifar10(True, root="/nonexistent", quiet=True)
    bad = data.corrupt_labels(ds, 0.3, mode=mode, seed=1)
    old, new = np.asarray(ds.targets), np.asarray(bad.targets)
    assert bad.corrupted.sum() == 1500
    assert np.all(new[bad.corrupted] != old[bad.corrupted]) and np.all(new[~bad.corrupted] == old[~bad.corrupted])
    if mode == "systematic":
        assert np.all(new[bad.corrupted] == np.asarray(data.SYSTEMATIC_SWAP)[old[bad.corrupted]])
    assert np.array_equal(new, data.corrupt_labels(ds, 0.3, mode=mode, seed=1).targets)
    assert ds.targets == old.tolist()  # the original is untouched


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_order_is_function_of_seed_epoch_and_resumes(workers):
    ds = data.take_fraction(data.load_cifar10(True, root="/nonexistent", quiet=True, augment=True), 0.1)
    full = [(x, y) for x, y in data.make_loader(ds, 50, seed=5, epoch=2, num_workers=workers)]
    again = [(x, y) for x, y in data.make_loader(ds, 50, seed=5, epoch=2)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full, again))
    resumed = list(data.make_loader(ds, 50, seed=5, epoch=2, start_batch=4, num_workers=workers))
    assert len(resumed) == len(full) - 4
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[4:], resumed))
    other_epoch = next(iter(data.make_loader(ds, 50, seed=5, epoch=3)))
    assert not torch.equal(other_epoch[1], full[0][1])
    state = torch.get_rng_state()
    list(data.make_loader(ds, 50, seed=5, epoch=2, num_workers=workers))
    assert torch.equal(state, torch.get_rng_state()), "the loader must not draw from the global torch RNG"


def test_models_are_small():
    assert count_parameters(build_model("tiny")) < count_parameters(build_model("small")) < 200_000
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in build_model("small").modules())
    assert build_model("small")(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="未知模型"):
        build_model("huge")


@pytest.mark.slow
def test_baseline_script_runs_offline_above_chance(tmp_path):
    from tests.support.notebook_cells import ROOT
    out = subprocess.run([sys.executable, str(ROOT / "notebooks/homework/train_cifar.py"), "--epochs", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    acc = float(out.stdout.strip().splitlines()[-1].split()[-1])
    assert acc > 0.2, out.stdout
