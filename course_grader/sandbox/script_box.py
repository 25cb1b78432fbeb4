"""The script box: one sandbox per run of a learner's homework script (the homework checks' launcher).

Part of :mod:`course_grader.sandbox`. A :class:`ScriptBox` is what a homework check
(:mod:`course_tools.checks.nb10_homework`) calls to start each run of a learner's script: the same
mounts, environment and limits as a kernel (:mod:`course_grader.sandbox.mounts`,
:mod:`course_grader.sandbox.limits`), its own cgroup, the learner's scripts read-only at their real
path, and the run's own folder the one host path it can change (:func:`folder_size` watched, the
sandbox killed past ``Limits.disk``). ``os.killpg`` of the process it returns ends the whole sandbox,
and that process's ``wait()`` returns once all of it is gone (:mod:`course_grader.sandbox.procs`).

Example::

    scripts = ScriptBox(scripts=(scratch,))   # a homework check's launcher
    proc = scripts([sys.executable, str(scratch / "train_cifar.py"), "--out", str(run)], cwd=scratch,
                   env=os.environ.copy(), stdout=log, writable=run)
    scripts.close()
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from course_grader.sandbox.cgroup import Cgroup
from course_grader.sandbox.limits import MiB, Limits, launch_config, launcher_command
from course_grader.sandbox.mounts import SANDBOX_HOME, bwrap_args, kernel_env
from course_grader.sandbox.procs import SandboxPopen

__all__ = ["ScriptBox", "folder_size"]


def folder_size(folder: Path, limit: int) -> int:
    """Bytes under ``folder`` (never following a link), counting stops once past ``limit``; entries count 4 KiB."""
    total = 0
    stack = [folder]
    while stack and total <= limit:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    total += 4096
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


@dataclass
class ScriptBox:
    """The homework checks' launcher (``Launcher`` in :mod:`course_tools.checks.nb10_homework`) for one learner.

    Each call starts one run of a learner's script in its own sandbox (own cgroup, same mounts and
    limits as a kernel): ``scripts`` (the scratch copy of this learner's scripts) appears at its real
    path as a private tmpfs holding its files read-only (a script may write beside itself, as on
    the learner's machine: those files vanish with the sandbox), ``readable`` is bound read-only,
    ``writable`` (the run's folder) read-write, and nothing else of the host is visible.
    A watcher thread kills the sandbox when the run folder grows past ``limits.disk`` and says so
    in the run's log. The process returned is a :class:`SandboxPopen`: ``proc.cpu_seconds()`` is the
    CPU time of the run's whole sandbox (what :func:`course_tools.cputime.cpu_clock` reads), and
    ``proc.wait()`` returns once every process of it has ended. ``sandbox=False``: the same launcher
    stub, environment and limits without bwrap (trusted scripts, and the baseline of
    ``bench/grading.py``). :meth:`close` after the check ends what is left and removes the cgroups.
    """

    scripts: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    limits: Limits = field(default_factory=Limits)
    threads: int = 1
    sandbox: bool = True

    def __post_init__(self) -> None:
        self._runs: list[SandboxPopen] = []
        self.killed: list[str] = []   # one line per run the watcher stopped

    def __call__(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO,
                 writable: Path) -> SandboxPopen:
        # What the check set (unbuffered output, one thread, ...), never what the instructor's shell holds.
        own = {k: v for k, v in env.items() if os.environ.get(k) != v}
        writable = Path(writable).resolve()
        if self.sandbox:
            inner = {**kernel_env(SANDBOX_HOME, "/tmp", self.threads), **own}
            cgroup = Cgroup.create(self.limits)
            info = os.pipe()  # bwrap writes its inner pid here (--info-fd): the kill of the outer one misses it
            command = launcher_command(launch_config(self.limits, None, cgroup),
                                       ["bwrap", "--info-fd", str(info[1]),
                                        *bwrap_args(self.limits, inner, [writable], self.readable, str(cwd),
                                                    self.scripts),
                                        "--", *argv])
            where, fds = None, (info[1],)
        else:
            home = writable.parent / f".{writable.name}.home"
            home.mkdir(exist_ok=True)
            inner = {**kernel_env(str(home), str(home), self.threads), **own}
            command, where = launcher_command(launch_config(self.limits, inner, None), argv), cwd
            cgroup, info, fds = None, None, ()
        proc = SandboxPopen(command, cgroup=cgroup, info=info, cwd=where, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=fds)
        self._runs.append(proc)
        threading.Thread(target=self._watch, args=(proc, writable, stdout), daemon=True).start()
        return proc

    def _watch(self, proc: SandboxPopen, folder: Path, log: IO) -> None:
        while proc.poll() is None:
            proc.sandbox.look()  # without a cgroup, what the sandbox's processes are
            if folder_size(folder, self.limits.disk) > self.limits.disk:
                proc.sandbox.end()
                line = (f"评分器: 运行目录写入超过 {self.limits.disk / MiB:.0f} MiB(检查点和日志远小于此),"
                        f"已终止整个沙箱")
                self.killed.append(line)
                try:
                    log.write(f"\n{line}\n")
                    log.flush()
                except (OSError, ValueError):
                    pass
                return
            time.sleep(0.2)

    def close(self) -> None:
        """End every run's sandbox (killing what still runs), wait for all of its processes, remove the cgroups."""
        for proc in self._runs:
            proc.sandbox.end()
            proc.wait()
            if proc.sandbox.cgroup:
                proc.sandbox.cgroup.close()
        self._runs.clear()
