"""train_cifar_pro.py --async-ckpt: a kill during a background write, SIGTERM with a write in flight, a failed write.

The runs start through a small launcher that slows down (or fails) the fsync of a checkpoint's
temp file when a background thread does it, so the temp file stays on disk long enough to be
seen and a kill lands inside the background write while the loop keeps training. Nothing else
changes: the script, its flags and its files are the real ones.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.checkpoint import CheckpointManager, load_verified
from tests.pro_runs import SCRIPT, TINY, finish, start, status, train_losses

pytestmark = pytest.mark.slow
# 15 steps per epoch, 30 steps in all, a checkpoint every 4 steps, 2 DataLoader workers (forked while a save
# may be in flight)
ARGS = [*TINY, "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3", "--workers", "2"]

LAUNCHER = r"""
import os, re, runpy, sys, threading, time
mode, seconds = sys.argv[1], float(sys.argv[2])
real_fsync, calls = os.fsync, []

def fsync(fd):
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if threading.current_thread() is not threading.main_thread() and re.match(r"\.step_\d+\.pt\.tmp-", name):
        calls.append(name)
        if mode == "slow":
            time.sleep(seconds)
        elif len(calls) > 1:  # "fail": the first background write succeeds, every later one finds the disk full
            raise OSError(28, "No space left on device")
    return real_fsync(fd)

os.fsync = fsync
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
TEMP = re.compile(r"^\.step_(\d+)\.pt\.tmp-(\d+)$")


def launch(out: Path, mode: str, *args: str, seconds: float = 0.6) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, mode, str(seconds), str(SCRIPT), "--out", str(out),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def temp_step_when_writing(proc: subprocess.Popen, out: Path, after: int, timeout: float = 180) -> int:
    """Wait until ``proc`` is writing a checkpoint newer than ``after`` in the background; its step.
    (A killed run's temp file, left until the next start cleans it, has another pid.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folder = out / "checkpoints"
        names = [m for p in (folder.iterdir() if folder.exists() else ()) if (m := TEMP.match(p.name))]
        newer = [int(m.group(1)) for m in names if int(m.group(1)) > after and int(m.group(2)) == proc.pid]
        if newer:
            return max(newer)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before a background write after step {after}: {proc.stdout.read()}")
        time.sleep(0.01)
    pytest.fail(f"no background write after step {after} within {timeout} s")


def complete_steps(out: Path) -> list[int]:
    """Steps of the checkpoints whose file and checksum are both on disk."""
    return sorted(int(p.name[5:13]) for p in (out / "checkpoints").glob("step_*.pt.sha256"))


def test_kill_and_sigterm_during_background_writes_resume_exactly(tmp_path):
    reference = start(tmp_path / "reference", *ARGS)  # synchronous saves, side by side with the chain
    out = tmp_path / "async"

    # 1. SIGKILL while a background write is in progress: the previous checkpoint is what survives
    proc = launch(out, "slow", *ARGS, "--async-ckpt")
    writing = temp_step_when_writing(proc, out, after=4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(TEMP.match(p.name) for p in (out / "checkpoints").iterdir()), "killed inside the write"
    assert writing not in complete_steps(out) and complete_steps(out), complete_steps(out)
    found = CheckpointManager(out / "checkpoints").load_latest()
    assert found.state["step"] == max(complete_steps(out)) < writing

    # 2. resumed with --async-ckpt; SIGTERM while a background write is in progress: it completes, then the stop save
    proc = launch(out, "slow", *ARGS, "--async-ckpt", "--resume")
    writing = temp_step_when_writing(proc, out, after=found.state["step"])
    proc.send_signal(signal.SIGTERM)
    code, output = finish(proc, 120)
    assert code == 75 and "清理了上次中断留下的" in output and f"从 {found.path.name} 续训" in output, output
    assert load_verified(out / "checkpoints" / f"step_{writing:08d}.pt")["step"] == writing, \
        "the write in flight at SIGTERM was finished, not abandoned"
    last = train_losses(out)[-1][0]
    assert CheckpointManager(out / "checkpoints").load_latest().state["step"] == last == status(out)["step"]
    assert not [p for p in (out / "checkpoints").iterdir() if TEMP.match(p.name)]

    # 3. resumed without --async-ckpt (a free field: the run's identity does not include it), to the end
    code, output = finish(start(out, *ARGS, "--resume"), 300)
    assert code == 0, output
    code, output = finish(reference, 300)
    assert code == 0, output
    assert train_losses(out) == train_losses(tmp_path / "reference"), \
        "async saves, a kill and a stop change nothing: every step once, bit-identical losses"


def test_a_failed_background_write_stops_the_run_before_the_next_save(tmp_path):
    args = [*TINY, "--epochs", "3", "--ckpt-every-steps", "10", "--log-every", "1", "--async-ckpt"]
    code, output = finish(launch(tmp_path, "fail", *args), 180)
    # saves at steps 10, 15 (end of epoch 0), 20...: the write of step 15 fails in the background
    assert code == 1 and "No space left on device" in output and "step_00000015.pt" in output, output
    assert "最新: step 10" in output, output
    assert status(tmp_path)["state"] == "failed"
    assert train_losses(tmp_path)[-1][0] < 20, "raised by the per-step check, not at the next save (step 20)"
    assert complete_steps(tmp_path) == [10] and not [p for p in (tmp_path / "checkpoints").iterdir()
                                                     if TEMP.match(p.name)]
