"""File I/O of course_utils.checkpoint: streamed SHA-256 on save and load, old files, disk errors, async saves.

Tiny states throughout; the costs at 100 M parameters are bench/checkpoint_cost.py's job.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import threading
import time

import pytest
import torch

from course_utils import checkpoint
from course_utils.checkpoint import CheckpointManager, CorruptCheckpointError, load_verified, save_verified


def tiny_state(step: int = 1, seed: int = 0) -> dict:
    """A state dict with what checkpoints hold: tensors of several dtypes, a view sharing its base's storage,
    nested containers, plain values."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(40, 30, generator=g)
    return {"model": {"weight": weight, "row": weight[3], "count": torch.tensor(7),
                      "half": torch.randn(5, generator=g).half()},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(40, 30, generator=g)}}, "param_groups": [{"lr": 0.1}]},
            "rng": {"torch": g.get_state()}, "nested": [1, (2.5, "x")], "step": step}


def same(a, b) -> bool:
    """Equal values, recursively (tensors: same dtype, shape and bits)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def old_style_save(state: dict, path) -> None:
    """How checkpoints were written before streaming: serialise to memory (CRC-32 on), hash, write, sidecar."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(buffer.getvalue())
    path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(buffer.getvalue()).hexdigest()}  {path.name}\n")


# ---------------------------------------------------------------- save
@pytest.mark.parametrize("parallel_min", [checkpoint._HashingWriter.PARALLEL_MIN, 1])
def test_streamed_save_hashes_exactly_the_file(tmp_path, monkeypatch, parallel_min):
    monkeypatch.setattr(checkpoint._HashingWriter, "PARALLEL_MIN", parallel_min)  # 1: every write in the helper
    path = tmp_path / "a.pt"
    digest = save_verified(tiny_state(), path)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (tmp_path / "a.pt.sha256").read_text() == f"{digest}  a.pt\n"  # the format of sha256sum
    loaded = torch.load(path, weights_only=True)  # plain torch reads it
    assert same(loaded, tiny_state())
    assert loaded["model"]["row"].untyped_storage().data_ptr() == loaded["model"]["weight"].untyped_storage().data_ptr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "a.pt.sha256"], "no temp file left"
    assert torch.serialization.get_crc32_options(), "torch's CRC-32 setting is restored"


def test_old_checkpoints_still_load(tmp_path):
    old_style_save(tiny_state(3), tmp_path / "step_00000003.pt")
    assert same(load_verified(tmp_path / "step_00000003.pt"), tiny_state(3))
    found = CheckpointManager(tmp_path).load_latest()
    assert found.path.name == "step_00000003.pt" and found.state["step"] == 3


def test_a_full_disk_mid_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    save_verified(tiny_state(1), path)
    real_write_all, written = checkpoint._write_all, []

    def disk_fills_up(file, data):
        if sum(written) > 2000:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(real_write_all(file, data))
        return written[-1]
    monkeypatch.setattr(checkpoint, "_write_all", disk_fills_up)
    with pytest.raises(OSError) as raised:
        save_verified(tiny_state(2), path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path), \
        "the disk error itself, naming the checkpoint (torch.save alone reports 'unexpected pos')"
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "a.pt.sha256"]
    assert load_verified(path)["step"] == 1
    assert torch.serialization.get_crc32_options()


def test_crc32_is_restored_only_after_the_last_overlapping_save():
    outer, inner = checkpoint._without_crc32(), checkpoint._without_crc32()
    with outer:
        with inner:
            assert not torch.serialization.get_crc32_options()
        assert not torch.serialization.get_crc32_options(), "another save is still writing"
    assert torch.serialization.get_crc32_options()


# ---------------------------------------------------------------- load
@pytest.mark.parametrize("damage, message", [("bitflip", "校验和不符"), ("truncate", "校验和不符"),
                                             ("no sidecar", "缺失"), ("garbage", "无法加载"), ("empty", "无法加载")])
def test_load_verified_refuses_damage(tmp_path, damage, message):
    path = tmp_path / "a.pt"
    save_verified(tiny_state(), path)
    payload = bytearray(path.read_bytes())
    sidecar = tmp_path / "a.pt.sha256"
    if damage == "bitflip":  # a flip in tensor data: torch.load itself does not notice
        payload[-2000] ^= 0x01
        path.write_bytes(bytes(payload))
        assert torch.load(path, weights_only=True)["step"] == 1
    elif damage == "truncate":
        path.write_bytes(bytes(payload[:len(payload) // 2]))
    elif damage == "no sidecar":
        sidecar.unlink()
    else:  # a file whose checksum matches but that is no checkpoint
        content = b"" if damage == "empty" else b"not a checkpoint"
        path.write_bytes(content)
        sidecar.write_text(f"{hashlib.sha256(content).hexdigest()}  a.pt\n")
    with pytest.raises(CorruptCheckpointError, match=message):
        load_verified(path)


def test_load_hashes_the_open_file_while_torch_loads_it(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    save_verified(tiny_state(), path)
    loading, seen = threading.Event(), {}
    real_load, real_mmap = torch.load, checkpoint.mmap.mmap

    def watched_load(f, *args, **kwargs):
        with open(path, "rb") as other:
            seen["same file"] = os.path.sameopenfile(f.fileno(), other.fileno())
        loading.set()
        return real_load(f, *args, **kwargs)

    def hash_waits_for_the_load(*args, **kwargs):  # deadlocks (False after 10 s) unless both run at once
        seen["in parallel"] = loading.wait(10)
        return real_mmap(*args, **kwargs)
    monkeypatch.setattr(checkpoint.torch, "load", watched_load)
    monkeypatch.setattr(checkpoint.mmap, "mmap", hash_waits_for_the_load)
    assert load_verified(path)["step"] == 1
    assert seen == {"same file": True, "in parallel": True}


# ---------------------------------------------------------------- asynchronous saves
@pytest.fixture
def gated(monkeypatch):
    """save_verified that waits for ``gate`` before writing; ``started`` lists the paths it began."""
    gate, started, real = threading.Event(), [], checkpoint.save_verified

    def slow(state, path):
        started.append(path.name)
        assert gate.wait(30), "the test never opened the gate"
        return real(state, path)
    monkeypatch.setattr(checkpoint, "save_verified", slow)
    return gate, started


def wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_async_save_returns_first_and_writes_the_state_as_it_was(tmp_path, gated):
    gate, started = gated
    manager = CheckpointManager(tmp_path, async_save=True, keep_last_good=True)
    state = tiny_state(5)
    before = {k: v.clone() for k, v in state["model"].items()}
    path = manager.save(state, 5, metric=0.5)
    wait_until(lambda: started)
    assert manager.saving and not path.exists() and not (tmp_path / "best.pt").exists()
    state["model"]["weight"].add_(1.0)  # training goes on while the file is written
    gate.set()
    manager.wait()
    assert not manager.saving
    saved = load_verified(path)["model"]
    assert same(saved, before) and not torch.equal(saved["weight"], state["model"]["weight"])
    for name in ("best.pt", "last_good.pt"):  # published once the file is complete
        assert load_verified(tmp_path / name)["step"] == 5


def test_at_most_one_save_in_flight_and_reads_wait_for_it(tmp_path, gated):
    gate, started = gated
    manager = CheckpointManager(tmp_path, async_save=True)
    manager.save(tiny_state(1), 1)
    second = threading.Thread(target=manager.save, args=(tiny_state(2), 2))
    second.start()
    time.sleep(0.2)
    assert started == ["step_00000001.pt"] and second.is_alive(), "the second save waits for the first"
    gate.set()
    second.join(30)
    assert manager.load_latest().state["step"] == 2, "load_latest waits for the save in flight"
    assert [p.name for p in manager.checkpoints()] == ["step_00000001.pt", "step_00000002.pt"]


def test_a_background_error_is_raised_in_the_loop_once(tmp_path, monkeypatch):
    def disk_full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(checkpoint, "save_verified", disk_full)
    manager = CheckpointManager(tmp_path, async_save=True)
    manager.save(tiny_state(1), 1)
    wait_until(lambda: not manager.saving)
    with pytest.raises(OSError, match="No space") as raised:
        manager.check()
    assert raised.value.filename.endswith("step_00000001.pt")
    manager.check()  # raised once, not forever
    manager.save(tiny_state(2), 2)
    with pytest.raises(OSError, match="No space"):
        manager.wait()
    manager.save(tiny_state(3), 3)
    with pytest.raises(OSError, match="No space"):
        manager.save(tiny_state(4), 4)  # the next save raises the previous one's error


def test_async_and_sync_saves_write_the_same_files(tmp_path):
    sync = CheckpointManager(tmp_path / "sync", keep_last=2, keep_last_good=True)
    background = CheckpointManager(tmp_path / "async", keep_last=2, keep_last_good=True, async_save=True)
    for step, metric, healthy in [(1, 0.2, True), (2, 0.5, True), (3, 0.4, False), (4, 0.3, False)]:
        for manager in (sync, background):
            manager.save(tiny_state(step, seed=step), step, metric, healthy=healthy)
    background.wait()
    names = sorted(p.name for p in (tmp_path / "sync").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "async").iterdir())
    assert names == ["best.pt", "best.pt.sha256", "last_good.pt", "last_good.pt.sha256", "step_00000003.pt",
                     "step_00000003.pt.sha256", "step_00000004.pt", "step_00000004.pt.sha256"]
    for name in names[::2]:  # the same content (the bytes differ: torch.save writes a random serialization id)
        assert same(load_verified(tmp_path / "sync" / name), load_verified(tmp_path / "async" / name)), name


def test_staging_buffers_are_reused_and_keep_shared_storage_shared(tmp_path):
    manager = CheckpointManager(tmp_path, async_save=True)
    state = tiny_state()
    first = manager._stage(state)
    assert same(first, state) and first["model"]["weight"].data_ptr() != state["model"]["weight"].data_ptr()
    assert first["model"]["row"].untyped_storage().data_ptr() == first["model"]["weight"].untyped_storage().data_ptr()
    second = manager._stage(state)
    assert second["model"]["weight"].data_ptr() == first["model"]["weight"].data_ptr(), "no new allocation"
    state["model"]["weight"] = torch.randn(50, 30)  # another size: a new buffer for it
    third = manager._stage(state)
    assert same(third, state) and third["model"]["weight"].data_ptr() != first["model"]["weight"].data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_are_staged_in_pinned_host_memory(tmp_path):
    manager = CheckpointManager(tmp_path, async_save=True)
    state = {"w": torch.randn(1000, device="cuda"), "step": 1}
    staged = manager._stage(state)
    assert staged["w"].device.type == "cpu" and staged["w"].is_pinned()
    assert torch.equal(staged["w"], state["w"].cpu())
    manager.save(state, 1)
    manager.wait()
    assert torch.equal(load_verified(tmp_path / "step_00000001.pt")["w"], state["w"].cpu())
