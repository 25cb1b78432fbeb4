"""A sandbox's processes (course_grader.sandbox.procs, course_tools.cputime): CPU clocks that count what was
computed, by children that exited and by orphans too, and a kill after which no process is left.

The cell limits under load (a cell beside CPU hogs) are in tests/test_grade.py.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from course_grader import sandbox
from course_tools.cputime import TreeClock, cpu_clock

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"  # 0.5 CPU-s


def test_tree_clock_keeps_the_time_of_a_reaped_child():
    code = ("import subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', {BURN!r}])\n"
            "print('reaped', flush=True)\nsys.stdin.readline()\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        clock = TreeClock(parent.pid)
        readings = [clock()]
        while not select.select([parent.stdout], [], [], 0.02)[0]:   # while the child burns
            readings.append(clock())
        assert parent.stdout.readline() == "reaped\n"
        assert psutil.Process(parent.pid).children() == []          # the child is gone ...
        readings += [clock(), clock()]
        assert readings == sorted(readings) and readings[-1] >= 0.45, readings   # ... its time is still counted
    finally:
        parent.kill()
        parent.wait()


def test_cgroup_clock_counts_an_orphan_that_exited():
    cgroup = sandbox.Cgroup.create(sandbox.Limits())
    if cgroup is None or cgroup.cpu is None:
        if cgroup:
            cgroup.close()
        pytest.skip("no writable cgroup with CPU accounting here (v2: memory and pids delegated; v1: cpuacct)")
    code = ("import os, sys\n"
            "if os.fork() == 0:\n"
            "    if os.fork() == 0:\n" + textwrap.indent(BURN, " " * 8) + "        os._exit(0)\n"
            "    os._exit(0)\n"
            "os.wait()\nprint('forked', flush=True)\nsys.stdin.readline()\n")

    def join() -> None:
        for path in cgroup.procs:
            Path(path).write_text(str(os.getpid()))

    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=join)
    try:
        assert proc.stdout.readline() == "forked\n"
        readings, deadline = [cgroup.cpu_seconds()], time.monotonic() + 60
        while cgroup.members() != {proc.pid} and time.monotonic() < deadline:   # the orphan burns, then exits
            readings.append(cgroup.cpu_seconds())
            time.sleep(0.02)
        assert cgroup.members() == {proc.pid}
        readings.append(cgroup.cpu_seconds())
        assert readings == sorted(readings) and readings[-1] >= 0.45, readings
        assert TreeClock(proc.pid)() < 0.3     # the orphan was reaped outside the tree: only the cgroup saw it
    finally:
        proc.kill()
        proc.wait()
        cgroup.close()
    assert not any(d.exists() for d in cgroup.dirs)


# ---------------------------------------------------------------- a script run's sandbox, killed

DETACH = ("import os, sys, time\n"
          "if os.fork() == 0:\n"
          "    os.setsid()\n"
          "    if os.fork() == 0:\n"
          "        hold = b'x' * (256 << 20)\n"   # the detached sleeper: its memory makes its exit take a while
          "        time.sleep(600)\n"
          "    os._exit(0)\n"
          "os.wait()\n"
          "print('ready', flush=True)\n"
          "time.sleep(600)\n")


def _with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``marker`` (a zombie's is empty)."""
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]


def _alive(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` still running (one look each: no time for them to finish dying)."""
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.info['cmdline'][:1]}")
        except psutil.Error:
            continue
    return out


def _start(box: sandbox.ScriptBox, folder: Path, marker: str, run: Path) -> sandbox.SandboxPopen:
    """Start DETACH in ``box``; return once it says that its sleeper runs (read from a pipe: no polling)."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        run.mkdir()
        proc = box([sys.executable, str(folder / "detach.py"), marker], cwd=folder, env={}, stdout=out, writable=run)
    with os.fdopen(read) as log:
        assert log.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "process-tree"])
def test_a_killed_script_run_leaves_no_process(tmp_path, monkeypatch, cgroups):
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (Debian package 'bubblewrap', command bwrap)")
    sandbox.check_available()
    if not cgroups:
        monkeypatch.setattr(sandbox.Cgroup, "create", classmethod(lambda cls, limits: None))
    elif (probe := sandbox.Cgroup.create(sandbox.Limits())) is None:
        pytest.skip("no writable cgroup here")
    else:
        probe.close()
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "detach.py").write_text(DETACH)
    killed, left = f"killed-{uuid.uuid4().hex}", f"left-{uuid.uuid4().hex}"
    box = sandbox.ScriptBox((folder,))
    try:
        proc = _start(box, folder, killed, tmp_path / "run1")
        assert (proc.sandbox.cgroup is not None) == cgroups and cpu_clock(proc) == proc.cpu_seconds
        procs = _with(killed)
        assert len(procs) >= 4     # launcher-turned-bwrap, bwrap's inner process, the script, the sleeper
        os.killpg(proc.pid, signal.SIGKILL)   # as a homework check kills a run: the outer bwrap only ...
        proc.wait()                           # ... and the wait outlasts the rest of the sandbox
        assert _alive(procs) == [] and _with(killed) == []
        if cgroups:
            assert proc.sandbox.cgroup.members() == set()
        second = _start(box, folder, left, tmp_path / "run2")
        dirs = second.sandbox.cgroup.dirs if cgroups else []
    finally:
        box.close()                           # a run still going: ended, waited for, its cgroup removed
    assert _alive(_with(left)) == [] and not any(d.exists() for d in dirs)
