"""File I/O of checkpoints: the in-line hash on save, the verified load, old sidecars, disk errors,
moving files aside, asynchronous saves.

Tiny states throughout; the costs at 100 M parameters are bench/checkpoint_cost.py's job.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import xxhash

from course_utils import checkpoint, durable
from course_utils.checkpoint import CheckpointManager, CorruptCheckpointError, load_verified, save_verified
from course_utils.checkpoint_async import AsyncCheckpointManager


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
def test_save_hashes_exactly_the_file_and_names_the_hash(tmp_path):
    path = tmp_path / "a.pt"
    digest = save_verified(tiny_state(), path)
    assert digest == "xxh3_128:" + xxhash.xxh3_128(path.read_bytes()).hexdigest()
    assert (tmp_path / "a.pt.sha256").read_text() == f"{digest}  a.pt\n"
    loaded = torch.load(path, weights_only=True)  # plain torch reads it
    assert same(loaded, tiny_state())
    assert loaded["model"]["row"].untyped_storage().data_ptr() == loaded["model"]["weight"].untyped_storage().data_ptr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "a.pt.sha256"], "no temp file left"
    assert torch.serialization.get_crc32_options(), "torch's own settings are left alone"


def test_old_checkpoints_and_sidecars_still_load_and_still_catch_damage(tmp_path):
    old_style_save(tiny_state(3), tmp_path / "step_00000003.pt")  # a bare SHA-256 hex digest in the sidecar
    assert same(load_verified(tmp_path / "step_00000003.pt"), tiny_state(3))
    found = CheckpointManager(tmp_path).load_latest()
    assert found.path.name == "step_00000003.pt" and found.state["step"] == 3
    payload = bytearray((tmp_path / "step_00000003.pt").read_bytes())
    payload[-2000] ^= 0x01  # the old SHA-256 really is checked, not only accepted
    (tmp_path / "step_00000003.pt").write_bytes(bytes(payload))
    with pytest.raises(CorruptCheckpointError, match="校验和不符"):
        load_verified(tmp_path / "step_00000003.pt")


def test_a_sidecar_naming_an_unknown_hash_is_refused(tmp_path):
    path = tmp_path / "a.pt"
    save_verified(tiny_state(), path)
    (tmp_path / "a.pt.sha256").write_text(f"md5:{hashlib.md5(path.read_bytes()).hexdigest()}  a.pt\n")
    with pytest.raises(CorruptCheckpointError, match="未知的校验算法"):
        load_verified(path)


def test_a_full_disk_mid_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    save_verified(tiny_state(1), path)
    real_write_all, written = durable.write_all, []

    def disk_fills_up(file, data):
        if sum(written) > 2000:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(real_write_all(file, data))
        return written[-1]
    monkeypatch.setattr(durable, "write_all", disk_fills_up)
    with pytest.raises(OSError) as raised:
        save_verified(tiny_state(2), path)
    assert written, "the save did write before the disk filled up"
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path), \
        "the disk error itself, naming the checkpoint (torch.save alone reports 'unexpected pos')"
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "a.pt.sha256"]
    assert load_verified(path)["step"] == 1


def test_durable_imports_only_the_standard_library():
    """runfolder (and so a script's start-up checks) uses durable before torch is imported."""
    code = "import sys, course_utils.runfolder; print(sorted({'torch', 'xxhash'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# ---------------------------------------------------------------- load
@pytest.mark.parametrize("damage, message", [("bitflip", "校验和不符"), ("truncate", "校验和不符"),
                                             ("no sidecar", "缺失"), ("empty sidecar", "缺失"),
                                             ("garbage", "无法加载"), ("empty", "无法加载")])
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
    elif damage == "empty sidecar":
        sidecar.write_text("")
    else:  # a file whose checksum matches but that is no checkpoint
        content = b"" if damage == "empty" else b"not a checkpoint"
        path.write_bytes(content)
        sidecar.write_text(f"xxh3_128:{xxhash.xxh3_128(content).hexdigest()}  a.pt\n")
    with pytest.raises(CorruptCheckpointError, match=message):
        load_verified(path)


def test_what_is_loaded_is_what_was_verified(tmp_path, monkeypatch):
    """The file replaced between the hash and the load (another process publishing): the verified bytes are loaded."""
    path, other = tmp_path / "a.pt", tmp_path / "b.pt"
    save_verified(tiny_state(1), path)
    save_verified(tiny_state(9), other)
    real_load, replaced = torch.load, []

    def load_after_a_replace(f, *args, **kwargs):
        os.replace(other, path)
        os.replace(tmp_path / "b.pt.sha256", tmp_path / "a.pt.sha256")
        replaced.append(True)
        return real_load(f, *args, **kwargs)
    monkeypatch.setattr(torch, "load", load_after_a_replace)
    assert load_verified(path)["step"] == 1 and replaced
    monkeypatch.undo()
    assert load_verified(path)["step"] == 9


# ---------------------------------------------------------------- moving files aside
def test_set_aside_renames_and_never_rewrites(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (2, 4, 6):
        manager.save(tiny_state(step), step)
    newest = tmp_path / "step_00000006.pt"
    inode, mtime = newest.stat().st_ino, newest.stat().st_mtime_ns
    resumed = CheckpointManager(tmp_path, keep_last=3)
    moved = resumed.set_aside(4)
    assert moved == [tmp_path / "superseded" / "step_00000006.pt"]
    assert (moved[0].stat().st_ino, moved[0].stat().st_mtime_ns) == (inode, mtime), "a rename: the same file"
    assert load_verified(moved[0])["step"] == 6, "its sidecar moved with it"


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
    manager = AsyncCheckpointManager(tmp_path, keep_last_good=True)
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
    manager = AsyncCheckpointManager(tmp_path)
    manager.save(tiny_state(1), 1)
    wait_until(lambda: started)  # the first save is being written (held at the gate)
    waiting, real_wait = threading.Event(), manager.wait

    def wait() -> None:  # save() begins with wait(): this marks that the second save got there
        waiting.set()
        real_wait()
    manager.wait = wait
    second = threading.Thread(target=manager.save, args=(tiny_state(2), 2))
    second.start()
    assert waiting.wait(30), "the second save never started"
    second.join(0.05)  # it cannot pass the first save's writer, which the closed gate holds
    assert started == ["step_00000001.pt"] and second.is_alive() and manager.saving, \
        "the second save waits for the first"
    del manager.wait
    gate.set()
    second.join(30)
    assert manager.load_latest().state["step"] == 2, "load_latest waits for the save in flight"
    assert [p.name for p in manager.checkpoints()] == ["step_00000001.pt", "step_00000002.pt"]


def test_a_background_error_is_raised_in_the_loop_once(tmp_path, monkeypatch):
    def disk_full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(checkpoint, "save_verified", disk_full)
    manager = AsyncCheckpointManager(tmp_path)
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
    background = AsyncCheckpointManager(tmp_path / "async", keep_last=2, keep_last_good=True)
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
    manager = AsyncCheckpointManager(tmp_path)
    state = tiny_state()
    first = manager.stage(state)
    assert same(first, state) and first["model"]["weight"].data_ptr() != state["model"]["weight"].data_ptr()
    assert first["model"]["row"].untyped_storage().data_ptr() == first["model"]["weight"].untyped_storage().data_ptr()
    second = manager.stage(state)
    assert second["model"]["weight"].data_ptr() == first["model"]["weight"].data_ptr(), "no new allocation"
    state["model"]["weight"] = torch.randn(50, 30)  # another size: a new buffer for it
    third = manager.stage(state)
    assert same(third, state) and third["model"]["weight"].data_ptr() != first["model"]["weight"].data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_are_staged_in_pinned_host_memory(tmp_path):
    manager = AsyncCheckpointManager(tmp_path)
    state = {"w": torch.randn(1000, device="cuda"), "step": 1}
    staged = manager.stage(state)
    assert staged["w"].device.type == "cpu" and staged["w"].is_pinned()
    assert torch.equal(staged["w"], state["w"].cpu())
    manager.save(state, 1)
    manager.wait()
    assert torch.equal(load_verified(tmp_path / "step_00000001.pt")["w"], state["w"].cpu())
