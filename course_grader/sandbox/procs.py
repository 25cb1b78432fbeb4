"""The processes of one sandbox: who they are, their CPU clock, and ending all of them.

The clock is the cgroup's counter, else a :class:`~course_tools.cputime.TreeClock` of the top pid; the grader
never returns while a process of a sandbox lives. Pitfall: bwrap's inner PID 1 runs in its own session
(``--new-session``), so ``os.killpg`` of the outer pid misses it (it dies through ``--die-with-parent``); its pid
comes from ``--info-fd``, and the processes seen under the top are remembered, so orphans are killed too.

Example::

    procs = SandboxProcesses(Cgroup.create(Limits()))
    procs.started(pid)
    assert procs.end() == []     # every process killed and gone
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import psutil

from course_tools.cputime import TreeClock
from course_grader.sandbox.cgroup import Cgroup

__all__ = ["END_TIMEOUT", "SandboxProcesses", "SandboxPopen"]

END_TIMEOUT = 10.0  # seconds :meth:`SandboxProcesses.end` waits for the killed processes to be gone


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class SandboxProcesses:
    """Every process of one sandbox (``cgroup``: its own, or None), its CPU clock, and the way to end them all.
    The processes seen under the top one (:meth:`look`) are remembered, so that those it orphans are still found."""

    def __init__(self, cgroup: Cgroup | None) -> None:
        self.cgroup = cgroup
        self.seen: set[psutil.Process] = set()
        self._top: psutil.Process | None = None
        self._clock: TreeClock | None = None

    def started(self, pid: int) -> None:
        """The sandbox's top process has started as ``pid``."""
        try:
            self._top = psutil.Process(pid)
        except psutil.Error:
            return
        self._clock = TreeClock(pid)
        self.look()

    def look(self, pid: int | None = None) -> None:
        """Remember the processes now in the tree under ``pid`` (default: the top process, while it runs)."""
        try:
            root = self._top if pid is None else psutil.Process(pid)
            if root is None or not root.is_running():  # a reaped top's pid may belong to someone else now
                return
            tree = {root, *root.children(recursive=True)}
        except psutil.Error:
            return
        self.seen = {p for p in self.seen if _running(p)} | tree

    def cpu_seconds(self) -> float:
        """CPU seconds used by the sandbox so far: the cgroup's counter, else the top process's tree."""
        if self.cgroup is not None and self.cgroup.cpu is not None:
            return self.cgroup.cpu_seconds()
        return self._clock() if self._clock is not None else 0.0

    def end(self, timeout: float = END_TIMEOUT) -> list[int]:
        """SIGKILL every process of the sandbox and wait until none is alive; returns the pids still alive
        after ``timeout`` seconds (none, unless a process hangs in the kernel)."""
        self.look()  # the tree before the kill: killing the top orphans the rest
        deadline = time.monotonic() + timeout
        while True:
            procs = [p for p in self.seen if _running(p)]
            members = (self.cgroup.members() if self.cgroup else set()) - {p.pid for p in procs}
            if not procs and not members:
                return []
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()  # psutil refuses a pid that now belongs to another process
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
            if time.monotonic() >= deadline:
                return sorted({p.pid for p in procs} | members)
            time.sleep(0.01)


class SandboxPopen(subprocess.Popen):
    """One :class:`~course_grader.sandbox.boxes.ScriptBox` run: ``cpu_seconds()`` of its whole sandbox, and a
    ``wait()`` that returns once every process of it has ended (a check's ``os.killpg`` reaches the outer bwrap
    only). ``info``: the pipe whose write end bwrap got as ``--info-fd``; the inner pid read from it is remembered."""

    def __init__(self, args: list[str], *, cgroup: Cgroup | None, info: tuple[int, int] | None = None,
                 **kwargs) -> None:
        self.sandbox = SandboxProcesses(cgroup)
        try:
            super().__init__(args, **kwargs)
        except BaseException:
            if info is not None:
                os.close(info[0])
            raise
        finally:
            if info is not None:
                os.close(info[1])
        self.sandbox.started(self.pid)
        if info is not None:
            with os.fdopen(info[0], "rb") as pipe:
                text = pipe.read(1 << 16)   # EOF as soon as bwrap has written it (or failed)
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.sandbox.look(int(json.loads(text)["child-pid"]))

    def cpu_seconds(self) -> float:
        return self.sandbox.cpu_seconds()

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self.sandbox.end()
        return code
