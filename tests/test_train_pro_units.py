"""The mechanisms under the professional script, one at a time: run folder, lock, status, identity,
bad-step rate, explosion detection, unreadable real data. Fast: no training."""
from __future__ import annotations

import fcntl
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from course_utils import data, runfolder
from course_utils.alerts import RecentSteps, SpikeDetector
from course_utils.monitor import Monitor
from course_utils.runfolder import Refused, RunFolder, config_changes, read_status
from tests.support.pro_runs import fake_cifar


def test_claim_refuses_a_second_holder_and_releases_on_exit(tmp_path):
    with RunFolder.claim(tmp_path / "run", resume=False):  # (reading run.lock here would drop the lock)
        child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            from course_utils.runfolder import RunFolder, Refused
            try:
                RunFolder.claim({str(tmp_path / 'run')!r}, resume=True)
            except Refused as exc:
                print(exc)""")], capture_output=True, text=True, timeout=60)
        assert f"pid {os.getpid()}" in child.stdout and "同时只能跑一个运行" in child.stdout, child
    with RunFolder.claim(tmp_path / "run", resume=True):  # released: claimable again
        pass


def test_lockf_dies_with_the_trainer_although_forked_children_live_on(tmp_path):
    """Why lockf and not flock: a killed trainer's DataLoader workers (forked children) outlive it
    for seconds. An flock lock would live on in them and refuse the restart; a lockf lock does not."""
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        from course_utils.runfolder import RunFolder
        run = RunFolder.claim({str(tmp_path / 'run')!r}, resume=True)
        side = os.open({str(tmp_path / 'flocked')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(side, fcntl.LOCK_EX)              # the pitfall, for comparison
        worker = os.fork()
        if worker == 0:                               # a "DataLoader worker"
            time.sleep(30)
            os._exit(0)
        print(worker, flush=True)
        time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    worker = int(trainer.stdout.readline())
    try:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        os.kill(worker, 0)  # the orphaned worker is alive
        side = os.open(tmp_path / "flocked", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # and keeps the flock lock of its dead parent
                fcntl.flock(side, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(side)
        with RunFolder.claim(tmp_path / "run", resume=True):  # the lockf lock died with the trainer
            pass
    finally:
        os.kill(worker, signal.SIGKILL)


def test_holds_run_overwrite_moves_aside(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"hparams": {"seed": 0}}))
    assert not runfolder.holds_run(out), "a start that made no progress is not a run to protect"
    with RunFolder.claim(out, resume=False):
        pass
    (out / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    assert runfolder.holds_run(out)
    with pytest.raises(Refused, match="--overwrite"):
        RunFolder.claim(out, resume=False)
    with RunFolder.claim(out, resume=False, overwrite=True) as run:
        assert run.moved_aside is not None and run.moved_aside.name.startswith("run.replaced-")
        assert (run.moved_aside / "metrics.jsonl").read_text() == '{"split": "train", "step": 1}\n'
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


def test_status_file_and_liveness(tmp_path):
    with RunFolder.claim(tmp_path / "run", resume=False) as run:
        run.write_status("running", 3, total_steps=10)
        with pytest.raises(ValueError):
            run.write_status("crashed", 3)
        state = json.loads(subprocess.run(
            [sys.executable, "-c", f"import json; from course_utils.runfolder import read_status; "
                                   f"print(json.dumps(read_status({str(tmp_path / 'run')!r})))"],
            capture_output=True, text=True, timeout=60).stdout)
        assert state["state"] == "running" and state["alive"] is True and state["pid"] == os.getpid()
    assert read_status(tmp_path / "run")["alive"] is False  # "running" without a holder: it was killed


def test_config_changes_free_changeable_and_refused():
    saved = {"lr": 1e-3, "batch_size": 32, "seed": 0, "workers": 0, "epochs": 2}
    new = {"lr": 3e-3, "batch_size": 32, "seed": 0, "workers": 4, "epochs": 2, "new_flag": False}
    kw = dict(free={"workers"}, changeable={"lr", "epochs"}, defaults={"new_flag": False})
    with pytest.raises(Refused, match=r"lr 0.001 → 0.003\(确要修改请加 --allow-change lr\)"):
        config_changes(saved, new, allowed=(), **kw)
    assert config_changes(saved, new, allowed={"lr"}, **kw) == {"lr": (1e-3, 3e-3)}
    with pytest.raises(Refused, match=r"batch_size 32 → 64.*seed 0 → 1"):
        config_changes(saved, {**new, "batch_size": 64, "seed": 1}, allowed={"lr", "batch_size"}, **kw)
    with pytest.raises(Refused, match="new_flag"):  # a flag the run never had is compared with its default
        config_changes(saved, {**new, "new_flag": True}, allowed={"lr"}, **kw)


def test_record_changes_appends_history(tmp_path):
    with RunFolder.claim(tmp_path / "run", resume=False) as run:
        config = {"hparams": {"lr": 1e-3, "seed": 0}}
        config = run.record_changes(config, {"lr": (1e-3, 3e-4)}, step=40)
        config = run.record_changes(config, {}, step=50)
        saved = run.saved_config()
    assert saved == config and saved["hparams"]["lr"] == 3e-4
    assert [(h["step"], h["changes"]) for h in saved["history"]] == [(40, {"lr": [1e-3, 3e-4]})]


def test_recent_steps_counts_a_rate_not_a_streak():
    bad = RecentSteps(window=10)
    for step in range(1, 41, 2):  # every other step is bad: never 2 in a row
        bad.add(step)
        bad.add(step)  # marked twice (skipped and spiked): counts once
    assert bad.count(40) == 5  # 31, 33, ..., 39
    restored = RecentSteps(window=10)
    restored.load_state_dict(bad.state_dict())
    assert restored.count(40) == 5 and restored.count(49) == 0


def test_explosion_before_warmup_is_a_spike_only_when_asked():
    plain, exploding = SpikeDetector(), SpikeDetector(explode_ratio=10.0)
    for value in (2.3, 2.2, 2.25):
        assert not plain.update(value) and not exploding.update(value)
    assert not plain.update(3.8e11), "the default rule needs 20 values: the nb06 exercise's reference"
    assert exploding.update(3.8e11)
    assert not SpikeDetector(explode_ratio=10.0).update(1e9), "nothing to compare the first value with"


def test_monitor_health_window(tmp_path):
    import torch
    mon = Monitor(tmp_path, flush_every=1, progress=False, trouble_window=5)
    for step in range(1, 4):
        mon.log_step(step, 0, torch.tensor(2.3), torch.tensor(1.0), False, 0.1, 8)
    assert mon.healthy(3)
    mon.log_step(4, 0, torch.tensor(float("nan")), torch.tensor(float("nan")), False, 0.1, 8, skipped=True)
    assert mon.trouble.count(4) == 1 and not mon.healthy(4)
    mon.log_step(5, 0, torch.tensor(4e3), torch.tensor(1.0), False, 0.1, 8)  # 10x above every loss so far
    assert mon.trouble.count(5) == 2 and any(a["title"] == "loss spike" and a["step"] == 5 for a in mon.alerts)
    fresh = Monitor(tmp_path / "b", progress=False, trouble_window=5)
    fresh.load_state_dict(mon.state_dict())
    assert fresh.trouble.count(5) == 2
    assert not mon.healthy(9) and mon.healthy(10), "healthy again once the window holds no bad step"
    mon.close()
    fresh.close()


def test_unreadable_real_data_is_an_error_naming_the_file_not_a_silent_stand_in(tmp_path):
    folder = fake_cifar(tmp_path / "ok")
    assert data.load_cifar10(True, root=tmp_path / "ok", quiet=True).source == "cifar10"
    fake_cifar(tmp_path / "cut", truncate="data_batch_1")
    with pytest.raises(data.UnreadableDataError, match="data_batch_1"):
        data.load_cifar10(True, root=tmp_path / "cut", quiet=True)
    assert data.load_cifar10(False, root=tmp_path / "cut", quiet=True).source == "cifar10"  # the test split is fine
    (folder / "data_batch_3").unlink()
    with pytest.raises(data.UnreadableDataError, match="缺少.*data_batch_3"):
        data.load_cifar10(True, root=tmp_path / "ok", quiet=True)
    (folder / "test_batch").write_bytes(pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}))
    with pytest.raises(data.UnreadableDataError, match="test_batch"):
        data.load_cifar10(False, root=tmp_path / "ok", quiet=True)
    assert data.load_cifar10(False, root=tmp_path / "none", quiet=True).source == "synthetic"  # no data at all
