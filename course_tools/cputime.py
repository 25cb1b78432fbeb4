"""CPU seconds used by a process and everything it started: time limits that do not depend on load.

Why: a wall-clock limit fails honest work on a busy machine (two CPU hogs on two cores make a run three times
slower in wall time, not in CPU time), so the grader and the homework checks limit what a script *computes*, with
a wall-clock backstop (``WALL_FACTOR`` times the CPU limit) for code that only sleeps. :class:`TreeClock` sums the
own and reaped children's CPU time of a process and its live descendants (``psutil``; a bubblewrap PID namespace
is seen from outside as ordinary descendants); :func:`cpu_clock` prefers a sandbox's cgroup counter, exact even
for orphans. Pitfall: a reading walks ``/proc`` (about a millisecond): read at the polling interval, not in a
tight loop. :func:`cpu_hogs` is the load the tests and ``bench/under_load.py`` prove this against. Example::

    proc = subprocess.Popen(cmd, start_new_session=True)
    clock = TreeClock(proc.pid)
    while proc.poll() is None and clock() < 60:
        time.sleep(0.2)
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Callable

import psutil

__all__ = ["WALL_FACTOR", "TreeClock", "cpu_clock", "cpu_hogs"]

WALL_FACTOR = 5  # the wall-clock backstop of a CPU-time limit: code that sleeps is stopped after this many times it


def _seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class TreeClock:
    """CPU seconds of process ``pid`` and its descendants since they started (never decreasing)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._best = 0.0

    def __call__(self) -> float:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return self._best
        total = 0.0
        for proc in procs:
            try:
                total += _seconds(proc)
            except psutil.Error:  # gone between the listing and the reading: its time is in its parent's soon
                continue
        self._best = max(self._best, total)
        return self._best


def cpu_clock(proc) -> Callable[[], float]:
    """The CPU clock of a started process: its own ``cpu_seconds`` (a sandbox's cgroup counter) if it has one,
    else a :class:`TreeClock` of its pid."""
    own = getattr(proc, "cpu_seconds", None)
    return own if callable(own) else TreeClock(proc.pid)


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` plain Python busy loops for the duration of the block, killed on the way out whatever happens.

    Pitfall: each runs in a session of its own. With the kernel's autogroup scheduling a session shares
    the CPU as one group, so hogs started in one session barely slow a sandbox (a session too) beside
    them, however high the load average climbs.
    """
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True:\n    pass"], start_new_session=True))
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
