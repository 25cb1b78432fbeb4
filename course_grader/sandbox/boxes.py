"""The two sandboxes (:class:`KernelBox`, :class:`ScriptBox`), both started by :func:`box_command`, and what learner
code can see in them: the mounts (:func:`bwrap_args`) and the environment (:func:`kernel_env`).

The root is an empty tmpfs, remounted read-only, with only :func:`readonly_paths` bound read-only: ``/usr``, a few
files of ``/etc`` (no ``shadow``, no keys), Python, the venv and the course packages the GRADER imported (never
``solutions/``, ``.git`` or ``tests/``; :func:`~course_grader.pipeline.grade_all` refuses references, submissions
and a report under a bound path). Writable: size-capped tmpfs ``/scratch``, ``/tmp``, ``/dev/shm``, ``$HOME`` and
the host paths the caller names. The environment is :func:`kernel_env` alone; its ``PYTHONPATH`` names the grader's
own packages (an editable install may point at another checkout, which is not mounted). A kernel talks to the grader
over Unix sockets in its box folder (``ipc``: TCP inside a network namespace is unreachable), the one host folder it
can write, watched by :meth:`KernelBox.connection_abuse`. Pitfall: ``interrupt_mode: message``, since a signal to
the sandbox's process group would kill the sandbox.

Example::

    args = bwrap_args(Limits(), kernel_env(SANDBOX_HOME, "/tmp"), writable=[run_folder])
    box = KernelBox(private_dir(), Limits(), threads=1)   # box.kernel_name, box.spec_manager(), box.connection_file
    box.close()                                           # every process of the sandbox killed and gone
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from course_tools.noninteractive import quiet_environ
from course_grader.sandbox.procs import (MiB, Cgroup, Limits, SandboxPopen, SandboxProcesses, launch_config,
                                          launcher_command)

if TYPE_CHECKING:
    from jupyter_client.kernelspec import KernelSpecManager

__all__ = ["SANDBOX_CWD", "SANDBOX_HOME", "course_packages", "package_roots", "readonly_paths", "kernel_env",
           "bwrap_args", "KERNEL_NAME", "box_command", "KernelBox", "ScriptBox", "folder_size"]

SANDBOX_CWD = "/scratch"
SANDBOX_HOME = "/home/learner"

# Files of /etc a Python process needs; everything else there (shadow, ssh keys, ...) stays hidden.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "fonts", "passwd", "group", "nsswitch.conf",
        "localtime", "mime.types", "os-release", "hosts")


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def course_packages() -> list[Path]:
    """The folders of the two course packages this (grader) process imported."""
    import course_tools
    import course_utils

    return [Path(m.__file__).resolve().parent for m in (course_utils, course_tools)]


@functools.lru_cache(maxsize=None)
def package_roots() -> tuple[Path, ...]:
    """The folders holding the course packages this (grader) process imported: ``PYTHONPATH`` inside."""
    return tuple(dict.fromkeys(p.parent for p in course_packages()))


@functools.lru_cache(maxsize=None)
def readonly_paths() -> tuple[Path, ...]:
    """Host paths bound read-only into the sandbox, outermost first, none inside another."""
    wanted = [Path("/usr")] + [Path("/etc") / name for name in _ETC]
    wanted += [Path(p) for p in {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}]
    wanted += course_packages()
    chosen: list[Path] = []
    for path in sorted({p.resolve() for p in wanted if p.exists()}, key=lambda p: len(p.parts)):
        if not _under(path, chosen):
            chosen.append(path)
    return tuple(chosen)


def kernel_env(home: str, tmp: str, threads: int = 0) -> dict[str, str]:
    """The whole environment of a graded kernel: nothing inherited from the instructor's shell."""
    env = quiet_environ({}, override=True)  # COURSE_FAST=1, wandb offline
    env.update({"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
                "HOME": home, "TMPDIR": tmp, "IPYTHONDIR": os.path.join(tmp, ".ipython"), "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "JUPYTER_PLATFORM_DIRS": "1",
                "PYTHONPATH": os.pathsep.join(str(p) for p in package_roots())})
    if threads:
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def bwrap_args(limits: Limits, env: dict[str, str], writable: list[Path], readable: tuple[Path, ...] = (),
                cwd: str = SANDBOX_CWD, scripts: tuple[Path, ...] = ()) -> list[str]:
    """bwrap's options for one sandbox: the mounts (``writable`` read-write, ``readable`` read-only, each of
    ``scripts`` a private tmpfs of its files read-only), ``env`` as the whole environment, ``cwd`` inside."""
    # The tmpfs mounts come first: a virtual environment or a grader folder under /tmp is bound on top.
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--dev", "/dev", "--size", str(limits.shm), "--tmpfs", "/dev/shm", "--proc", "/proc",
            "--size", str(limits.tmp), "--tmpfs", "/tmp",
            "--size", str(limits.home), "--tmpfs", SANDBOX_HOME,
            "--size", str(limits.scratch), "--tmpfs", SANDBOX_CWD]
    for path in readonly_paths():
        args += ["--ro-bind", str(path), str(path)]
    for top in ("bin", "lib", "lib32", "lib64", "sbin"):  # merged /usr: /bin -> usr/bin ...
        link = Path("/") / top
        if link.is_symlink():
            args += ["--symlink", os.readlink(link), str(link)]
        elif link.is_dir() and not _under(link, list(readonly_paths())):
            args += ["--ro-bind", str(link), str(link)]
    for path in readable:
        args += ["--ro-bind", str(path), str(path)]
    for folder in scripts:  # a private tmpfs at the folder's path, its entries bound read-only into it
        args += ["--size", str(limits.tmp), "--tmpfs", str(folder)]
        for entry in sorted(Path(folder).iterdir()):
            args += ["--ro-bind", str(entry), str(entry)]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    args += ["--chdir", cwd,
             "--remount-ro", "/dev", "--remount-ro", "/"]  # the root tmpfs itself: no writes outside the above
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


KERNEL_NAME = "course-grading"
_CONN_LIMIT = 16 * MiB  # bytes the kernel may leave in its connection folder (sockets and the JSON are tiny)
_CONN_ENTRIES = 64


def box_command(limits: Limits, env: dict[str, str], argv: list[str], cgroup: Cgroup | None = None,
                writable: list[Path] = (), *, sandbox: bool = True, info_fd: int | None = None, **mounts) -> list[str]:
    """The command that runs ``argv`` in a sandbox: the launcher stub (``limits``, ``cgroup``), then bwrap (mounts:
    :func:`bwrap_args`; ``info_fd``: where it writes its inner pid); ``sandbox=False``: ``argv`` alone, same limits."""
    if not sandbox:
        return launcher_command(launch_config(limits, env, None), argv)
    info = ["--info-fd", str(info_fd)] if info_fd is not None else []
    return launcher_command(launch_config(limits, None, cgroup),
                            ["bwrap", *info, *bwrap_args(limits, env, list(writable), **mounts), "--", *argv])


@dataclass
class KernelBox(SandboxProcesses):
    """One kernel run's processes and a random folder (mode 0700) in the grader's ``private_dir`` holding the kernel
    spec, the connection folder (``ip``: socket path prefix) and, without the sandbox, the kernel's work, home, tmp."""

    private_dir: Path
    limits: Limits = field(default_factory=Limits)
    threads: int = 0
    sandbox: bool = True

    def __post_init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="k", dir=self.private_dir))
        self.conn = self.dir / "c"
        self.conn.mkdir(mode=0o700)
        self.kernels = self.dir / "kernels"
        self.connection_file = str(self.conn / "kernel.json")
        self.ip = str(self.conn / "s")
        SandboxProcesses.__init__(self, Cgroup.create(self.limits) if self.sandbox else None)
        if self.sandbox:
            self.cwd = str(self.dir)  # the launcher's cwd outside; inside, bwrap --chdir /scratch
            env = kernel_env(SANDBOX_HOME, "/tmp", self.threads)
        else:
            for name in ("work", "home", "tmp"):
                (self.dir / name).mkdir()
            self.cwd = str(self.dir / "work")
            env = kernel_env(str(self.dir / "home"), str(self.dir / "tmp"), self.threads)
        command = box_command(self.limits, env, [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              self.cgroup, [self.conn], sandbox=self.sandbox)
        spec = self.kernels / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": command, "display_name": "course grading (sandboxed)" if self.sandbox else "course grading",
            "language": "python", "interrupt_mode": "message", "metadata": {"debugger": False}}))

    kernel_name = KERNEL_NAME

    def spec_manager(self) -> KernelSpecManager:
        """A KernelSpecManager that knows only this box's kernel spec."""
        from jupyter_client.kernelspec import KernelSpecManager

        return KernelSpecManager(kernel_dirs=[str(self.kernels)])

    def connection_abuse(self) -> bool:
        """True when the kernel has written more than a few sockets' worth into its connection folder."""
        total = 0
        try:
            with os.scandir(self.conn) as entries:
                for n, entry in enumerate(entries):
                    if n >= _CONN_ENTRIES:
                        return True
                    total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            return False
        return total > _CONN_LIMIT

    def close(self) -> None:
        """End the kernel's sandbox, remove its cgroup and the box's folder."""
        self.end()
        if self.cgroup:
            self.cgroup.close()
        shutil.rmtree(self.dir, ignore_errors=True)


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
    """The homework checks' launcher (``Launcher`` in :mod:`course_tools.checks.nb10_homework`) for one learner:
    each call runs a script in its own sandbox (:func:`bwrap_args`: what a script writes beside itself vanishes), its
    run's folder writable; a watcher kills the sandbox past ``limits.disk`` and says so in the log.
    ``sandbox=False``: no bwrap (trusted scripts, ``bench/grading.py``'s baseline)."""

    scripts: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    limits: Limits = field(default_factory=Limits)
    threads: int = 1
    sandbox: bool = True

    def __post_init__(self) -> None:
        self._runs: list[SandboxPopen] = []
        self.killed: list[str] = []   # one line per run the watcher stopped

    def __call__(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO, writable: Path) -> SandboxPopen:
        # What the check set (unbuffered output, one thread, ...), never what the instructor's shell holds.
        own = {k: v for k, v in env.items() if os.environ.get(k) != v}
        writable = Path(writable).resolve()
        if self.sandbox:
            inner = {**kernel_env(SANDBOX_HOME, "/tmp", self.threads), **own}
            cgroup = Cgroup.create(self.limits)
            info = os.pipe()  # bwrap writes its inner pid here (--info-fd): the kill of the outer one misses it
            command = box_command(self.limits, inner, argv, cgroup, [writable], info_fd=info[1],
                                  readable=self.readable, cwd=str(cwd), scripts=self.scripts)
            where, fds = None, (info[1],)
        else:
            home = writable.parent / f".{writable.name}.home"
            home.mkdir(exist_ok=True)
            inner = {**kernel_env(str(home), str(home), self.threads), **own}
            command, where = box_command(self.limits, inner, argv, sandbox=False), cwd
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
                line = f"评分器: 运行目录写入超过 {self.limits.disk / MiB:.0f} MiB(检查点和日志远小于此),已终止整个沙箱"
                self.killed.append(line)
                with contextlib.suppress(OSError, ValueError):
                    log.write(f"\n{line}\n")
                    log.flush()
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
