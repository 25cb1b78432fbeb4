"""What one sandbox may use (:class:`Limits`) and its processes: the launcher stub that applies the limits before
bwrap, the sandbox's cgroup, its CPU clock, and ending every process of it.

The stub (``python -I -S``: no site, no user paths) joins the cgroup, sets ``RLIMIT_AS`` (``import torch`` alone
maps ~3.4 GiB: default 6 GiB), ``RLIMIT_FSIZE`` and no core files, dies with the grader (``PR_SET_PDEATHSIG``;
at once if it is already gone), then execs bwrap (``--no-sandbox``: the command, in the scrubbed environment).
:meth:`Cgroup.create` makes a child of the grader's own cgroup (v2, or v1 ``memory`` + ``pids`` + ``cpuacct``:
the memory and pids limits of the whole sandbox, which no rlimit gives) or returns None where none is writable;
the clock is then a :class:`~course_tools.cputime.TreeClock` of the top pid. The cgroup's CPU counter includes
exited and orphaned processes, so a limit in CPU seconds does not depend on the machine's load. The grader never
returns while a process of a sandbox lives. Pitfall: bwrap's inner PID 1 runs in its own session
(``--new-session``), so ``os.killpg`` of the outer pid misses it (it dies through ``--die-with-parent``); its pid
comes from ``--info-fd``, and the processes seen under the top are remembered, so orphans are killed too.

Example::

    cgroup = Cgroup.create(Limits())      # None: no writable cgroup here
    argv = launcher_command(launch_config(Limits(), None, cgroup), ["bwrap", *bwrap_args(...), "--", *command])
    procs = SandboxProcesses(cgroup)
    procs.started(pid)
    assert procs.end() == []     # every process killed and gone
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from course_tools.cputime import TreeClock

__all__ = ["GiB", "MiB", "Limits", "launcher_command", "launch_config", "END_TIMEOUT", "Cgroup", "alive",
           "SandboxProcesses", "SandboxPopen"]

GiB = 2 ** 30
MiB = 2 ** 20

_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
for path in cfg["cgroup_procs"]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
if os.getppid() != cfg["parent"]:
    os._exit(70)  # the grader is already gone
argv = sys.argv[3:]
if cfg["env"] is None:
    os.execvp(argv[0], argv)
os.execvpe(argv[0], argv, cfg["env"])
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox. ``memory`` is RLIMIT_AS per process; ``resident`` the cgroup's memory
    limit (default: ``memory``); ``disk`` what a homework run may leave in its run folder."""

    memory: int = 6 * GiB
    resident: int | None = None
    scratch: int = 2 * GiB
    tmp: int = 1 * GiB
    home: int = 256 * MiB
    shm: int = 1 * GiB
    file_size: int = 2 * GiB
    pids: int = 512
    disk: int = 1 * GiB


def launcher_command(cfg: dict, command: list[str]) -> list[str]:
    """The argv that applies ``cfg`` (:func:`launch_config`) to this process, then execs ``command``."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg), "--", *command]


def launch_config(limits: Limits, env: dict[str, str] | None, cgroup: Cgroup | None) -> dict:
    """What the launcher stub does: join ``cgroup``, set ``limits``' rlimits, exec in ``env`` (None: as inherited)."""
    return {"cgroup_procs": [str(p) for p in (cgroup.procs if cgroup else [])], "env": env, "parent": os.getpid(),
            "rlimits": {"RLIMIT_AS": limits.memory, "RLIMIT_FSIZE": limits.file_size, "RLIMIT_CORE": 0}}


END_TIMEOUT = 10.0  # seconds :meth:`SandboxProcesses.end` waits for the killed processes to be gone


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Cgroup:
    """One sandbox's cgroup (see the module docstring); ``cpu``: its CPU counter file, None where there is none."""

    dirs: list[Path]
    procs: list[Path]
    cpu: Path | None = None
    _seconds: float = field(default=0.0, repr=False)

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
        """A fresh child of this process's own cgroup, or None where no cgroup is writable."""
        name = f"course-grade-{os.getpid()}-{secrets.token_hex(4)}"
        made: list[Path] = []
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
            root = Path("/sys/fs/cgroup")
            if (root / "cgroup.controllers").exists():  # unified v2 hierarchy
                own = root / next(l.split(":", 2)[2] for l in lines if l.startswith("0::")).lstrip("/")
                if not {"memory", "pids"} <= set((own / "cgroup.subtree_control").read_text().split()):
                    return None
                made.append(own / name)
                made[-1].mkdir()
                settings = {made[0] / "memory.max": limits.resident or limits.memory,
                            made[0] / "memory.swap.max": 0, made[0] / "pids.max": limits.pids}
                cpu = made[0] / "cpu.stat"   # always there in v2, with or without the cpu controller
            else:  # v1: one hierarchy per controller
                where = {}
                for line in lines:
                    _, controllers, path = line.split(":", 2)
                    for c in controllers.split(","):
                        where[c] = path.lstrip("/")
                if "memory" not in where:
                    return None
                settings = {}
                for controller, key, value in (("memory", "memory.limit_in_bytes", limits.resident or limits.memory),
                                               ("pids", "pids.max", limits.pids)):
                    if controller in where and (root / controller).is_dir():
                        made.append(root / controller / where[controller] / name)
                        made[-1].mkdir()
                        settings[made[-1] / key] = value
                cpu = cls._cpuacct(root, where.get("cpuacct"), name, made)
            for target, value in settings.items():
                if target.exists():
                    target.write_text(str(value))
            return cls(made, [d / "cgroup.procs" for d in made], cpu)
        except (OSError, StopIteration, ValueError, IndexError):
            cls(made, []).close()
            return None

    @staticmethod
    def _cpuacct(root: Path, own: str | None, name: str, made: list[Path]) -> Path | None:
        """v1: a ``cpuacct`` child where that hierarchy is writable (optional: the tree clock stands in)."""
        if own is None or not (root / "cpuacct").is_dir():
            return None
        folder = root / "cpuacct" / own / name
        try:
            folder.mkdir()
        except OSError:
            return None
        made.append(folder)
        return folder / "cpuacct.usage"

    def cpu_seconds(self) -> float:
        """CPU seconds used in this cgroup so far, exited processes included (the last reading once removed)."""
        if self.cpu is not None:
            with contextlib.suppress(OSError, ValueError, StopIteration, IndexError):
                text = self.cpu.read_text()
                if self.cpu.name == "cpu.stat":
                    value = int(next(l.split()[1] for l in text.splitlines() if l.startswith("usage_usec "))) / 1e6
                else:
                    value = int(text) / 1e9
                self._seconds = max(self._seconds, value)
        return self._seconds

    def members(self) -> set[int]:
        """Pids of the processes still in the cgroup (zombies are not listed)."""
        pids: set[int] = set()
        for path in self.procs:
            try:
                pids.update(int(p) for p in path.read_text().split())
            except (OSError, ValueError):
                continue
        return pids

    @staticmethod
    def sweep(lines: list[str]) -> None:
        """Remove empty cgroups left by a grader that was killed (rmdir fails on a non-empty one)."""
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for c in (controllers.split(",") if controllers else [""]):
                parent = Path("/sys/fs/cgroup") / c / path.lstrip("/")
                for old in parent.glob("course-grade-*-*") if parent.is_dir() else []:
                    pid = old.name.split("-")[2]
                    if pid.isdigit() and not alive(int(pid)):
                        with contextlib.suppress(OSError):
                            old.rmdir()

    def close(self) -> None:
        """Remove the cgroup (after :meth:`SandboxProcesses.end` it is empty at once)."""
        for d in reversed(self.dirs):
            for _ in range(50):  # a process may still be exiting
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class SandboxProcesses:
    """Every process of one sandbox (``cgroup``: its own, or None; orphans found through :meth:`look`)."""

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
    """One :class:`~course_grader.sandbox.boxes.ScriptBox` run (see the module docstring): ``cpu_seconds()`` of its
    whole sandbox, and a ``wait()`` that returns once all its processes have ended; ``info``: the ``--info-fd`` pipe."""

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
