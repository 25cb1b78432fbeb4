"""train_cifar_pro.py --async-ckpt: a kill during a background write, SIGTERM with a write in flight, a failed write.

The runs start through a small launcher that holds (or fails) the fsync of a checkpoint's temp
file when a background thread does it: in "hold" mode the write tells the test, through a pipe,
which file it is writing and waits on a second pipe for the test's go. A kill or a SIGTERM thus
lands inside a background write by construction, while the loop keeps training, with no timing
to guess. Nothing else changes: the script, its flags and its files are the real ones.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.checkpoint import CheckpointManager, load_verified
from tests.support.pro_runs import SCRIPT, TINY, finish, start, status, train_losses

pytestmark = pytest.mark.slow
# 15 steps per epoch, 30 steps in all, a checkpoint every 4 steps, 2 DataLoader workers (forked while a save
# may be in flight)
ARGS = [*TINY, "--epochs", "2", "--ckpt-every-steps", "4", "--log-every", "3", "--workers", "2"]

LAUNCHER = r"""
import os, re, runpy, sys, threading
mode, go, told = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real_fsync, calls, holding = os.fsync, [], ([True] if mode == "hold" else [])

def fsync(fd):
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if threading.current_thread() is not threading.main_thread() and re.match(r"\.step_\d+\.pt\.tmp-", name):
        calls.append(name)
        if holding:  # "hold": say which file is being written, wait for the go (end of file: every later write goes)
            os.write(told, name.encode() + b"\n")
            if not os.read(go, 1):
                holding.clear()
        elif mode == "fail" and len(calls) > 1:  # the first background write succeeds, every later one: disk full
            raise OSError(28, "No space left on device")
    return real_fsync(fd)

os.fsync = fsync
sys.argv = sys.argv[4:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
TEMP = re.compile(r"^\.step_(\d+)\.pt\.tmp-(\d+)$")


class Launched:
    """The script started through LAUNCHER; in "hold" mode each background write waits at its fsync for a go."""

    def __init__(self, out: Path, mode: str, *args: str) -> None:
        go, self.go = os.pipe()
        self.told, told = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, mode, str(go), str(told), str(SCRIPT), "--out",
                                      str(out), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     pass_fds=(go, told))
        os.close(go)
        os.close(told)

    def held_write(self, timeout: float = 180) -> int:
        """Wait until a background write is held at its fsync; the step of the checkpoint it writes."""
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([self.told], [], [], timeout)[0]:
                pytest.fail(f"no background write within {timeout} s")
            chunk = os.read(self.told, 256)
            if not chunk:
                pytest.fail(f"the run ended before a background write: {self.proc.stdout.read()}")
            line += chunk
        match = TEMP.match(line.decode().strip())
        assert match and int(match.group(2)) == self.proc.pid, line
        return int(match.group(1))

    def let_go(self, every: bool = False) -> None:
        """Let the held write go on; ``every``: and every later one."""
        if every:
            os.close(self.go)
        else:
            os.write(self.go, b"1")

    def close(self) -> None:
        for fd in (self.go, self.told):
            try:
                os.close(fd)
            except OSError:  # already closed by let_go(every=True)
                pass


def complete_steps(out: Path) -> list[int]:
    """Steps of the checkpoints whose file and checksum are both on disk."""
    return sorted(int(p.name[5:13]) for p in (out / "checkpoints").glob("step_*.pt.sha256"))


def test_kill_and_sigterm_during_background_writes_resume_exactly(reference, tmp_path):
    out = tmp_path / "async"  # ``reference``: the session's uninterrupted run, synchronous saves

    # 1. SIGKILL while a background write is in progress (not the first: the previous checkpoint is what survives)
    run = Launched(out, "hold", *ARGS, "--async-ckpt")
    proc = run.proc
    while (writing := run.held_write()) <= 4:
        run.let_go()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run.close()
    assert any(TEMP.match(p.name) for p in (out / "checkpoints").iterdir()), "killed inside the write"
    assert writing not in complete_steps(out) and complete_steps(out), complete_steps(out)
    found = CheckpointManager(out / "checkpoints").load_latest()
    assert found.state["step"] == max(complete_steps(out)) < writing

    # 2. resumed with --async-ckpt; SIGTERM while a background write is in progress: it completes, then the stop save
    run = Launched(out, "hold", *ARGS, "--async-ckpt", "--resume")
    proc = run.proc
    writing = run.held_write()
    assert writing > found.state["step"]
    proc.send_signal(signal.SIGTERM)
    run.let_go(every=True)  # after the signal: the write was in flight when it came
    code, output = finish(proc, 120)
    run.close()
    assert code == 75 and "清理了上次中断留下的" in output and f"从 {found.path.name} 续训" in output, output
    assert load_verified(out / "checkpoints" / f"step_{writing:08d}.pt")["step"] == writing, \
        "the write in flight at SIGTERM was finished, not abandoned"
    last = train_losses(out)[-1][0]
    assert CheckpointManager(out / "checkpoints").load_latest().state["step"] == last == status(out)["step"]
    assert not [p for p in (out / "checkpoints").iterdir() if TEMP.match(p.name)]

    # 3. resumed without --async-ckpt (a free field: the run's identity does not include it), to the end
    code, output = finish(start(out, *ARGS, "--resume", interpreter="forked"), 300)
    assert code == 0, output
    assert train_losses(out) == train_losses(reference), \
        "async saves, a kill and a stop change nothing: every step once, bit-identical losses"


def test_a_failed_background_write_stops_the_run_before_the_next_save(tmp_path):
    args = [*TINY, "--epochs", "3", "--ckpt-every-steps", "10", "--log-every", "1", "--async-ckpt"]
    run = Launched(tmp_path, "fail", *args)
    code, output = finish(run.proc, 180)
    run.close()
    # saves at steps 10, 15 (end of epoch 0), 20...: the write of step 15 fails in the background
    assert code == 1 and "No space left on device" in output and "step_00000015.pt" in output, output
    assert "最新: step 10" in output, output
    assert status(tmp_path)["state"] == "failed"
    assert train_losses(tmp_path)[-1][0] < 20, "raised by the per-step check, not at the next save (step 20)"
    assert complete_steps(tmp_path) == [10] and not [p for p in (tmp_path / "checkpoints").iterdir()
                                                     if TEMP.match(p.name)]
