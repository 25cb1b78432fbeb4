"""The cgroup of one sandbox: memory and pids limits, a CPU counter, and the processes still in it.

:meth:`Cgroup.create` makes a child of the grader's own cgroup (v2, or v1 ``memory`` + ``pids`` + ``cpuacct``) or
returns None where none is writable (:mod:`.procs` then follows the process tree). Its CPU counter includes exited
and orphaned processes, so a limit in CPU seconds does not depend on the machine's load.

Example::

    cgroup = Cgroup.create(Limits())     # None: no writable cgroup here
    cgroup.cpu_seconds(), cgroup.members()
"""
from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_grader.sandbox.limits import Limits

__all__ = ["Cgroup", "alive"]


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
    """A child cgroup (v2, or v1 memory + pids + cpuacct) limiting one sandbox's memory and process count
    and counting its CPU time. ``cpu``: the counter file, None where no CPU accounting could be made."""

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
                settings = {"memory.max": limits.resident or limits.memory, "memory.swap.max": 0,
                            "pids.max": limits.pids}
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
                        settings[str(made[-1] / key)] = value
                cpu = cls._cpuacct(root, where.get("cpuacct"), name, made)
            for key, value in settings.items():
                target = Path(key) if os.path.isabs(key) else made[0] / key
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
