"""Bubblewrap sandboxes for learner code: one Jupyter kernel per graded notebook, one sandbox per run of a
homework script (instructor tool).

The grader never trusts the learner's code with anything it could abuse. Kernels are started through
a kernel spec whose command is ``bwrap`` (Debian package ``bubblewrap``); homework scripts through
:class:`ScriptBox`, the launcher the homework checks (:mod:`course_tools.checks.nb10_homework`) call.
Both get the same mounts, environment and limits:

- the root file system is an empty tmpfs with only what Python needs bound read-only, each at its
  real path: ``/usr``, a few files of ``/etc`` (no ``shadow``, no keys), the Python installation,
  the virtual environment (``sys.prefix``; in the README's layout that is ``.venv`` in the
  repository root, so the kernel sees ``.venv`` beside the two packages) and the two course
  packages (``course_utils``, ``course_tools``) that the GRADER imported. Nothing else of the
  repository exists inside: no ``solutions/``, ``.git``, ``tests/``, submissions, reports or grader
  files. ``PYTHONPATH`` inside is the folder holding the grader's packages, so the sandbox imports
  exactly them even when the environment's editable install points at another checkout (whose
  files are not mounted);
- writable: ``/scratch`` (the kernel's working folder), ``/tmp``, ``/dev/shm`` and an empty
  ``$HOME``, all tmpfs with a size cap, gone when the sandbox exits; a homework script
  additionally writes its own run folder (the one host path it can change, watched for size by
  the grader); the rest of the tree is read-only;
- a scrubbed environment (``--clearenv``: only PATH, HOME, PYTHONPATH, the quiet settings);
- new PID, network, IPC, UTS and user namespaces: the code sees only its own processes, every
  process it starts dies with the sandbox, and there is no network. The kernel talks to the grader
  over Unix sockets (jupyter_client's ``ipc`` transport) in a private folder bound into the sandbox:
  TCP ports inside a network namespace are unreachable from outside, Unix sockets are not;
- limits: ``RLIMIT_AS`` (address space per process; ``import torch`` alone maps about 3.4 GiB, so
  the default is 6 GiB), ``RLIMIT_FSIZE``, no core files, and a memory + pids cgroup where one is
  writable; the sandbox dies with the grader (``PR_SET_PDEATHSIG``) and with its launcher
  (``--die-with-parent``): ``os.killpg`` of the process a :class:`ScriptBox` returns ends the
  whole sandbox, and that process's ``wait()`` returns once all of it is gone;
- CPU time: each box counts the CPU seconds its sandbox uses (the cgroup's counter, else the
  process tree's), for limits that do not depend on the machine's load; ``KernelBox.end`` and the
  runs' ``wait`` SIGKILL every process of the sandbox and wait for them
  (:mod:`course_tools.sandbox.procs`);
- ``interrupt_mode: message``: an interrupt is a message, never a signal to the sandbox's process
  group (which would kill the sandbox).

The one host folder a kernel can write is its connection folder (the sockets must be created
there); the grader watches its size while the kernel runs (:meth:`KernelBox.connection_abuse`)
and deletes it afterwards. ``--no-sandbox`` runs the same kernels and scripts without bwrap (same
scrubbed environment, same limits, ``ipc`` transport) for trusted code and for measuring the
sandbox's cost.

Example::

    check_available()                      # raises SandboxUnavailable with a Chinese message
    box = KernelBox(private_dir, Limits(), threads=1)
    # AsyncKernelManager(kernel_name=box.kernel_name, kernel_spec_manager=box.spec_manager(),
    #                    transport="ipc", ip=box.ip, connection_file=box.connection_file)
    box.started(km.provisioner.pid)        # then box.cpu_seconds() is the kernel's CPU clock
    box.close()                            # every process of the sandbox killed and gone
    scripts = ScriptBox(scripts=(scratch,))   # a homework check's launcher
    proc = scripts([sys.executable, str(scratch / "train_cifar.py"), "--out", str(run)], cwd=scratch,
                   env=os.environ.copy(), stdout=log, writable=run)
    scripts.close()
"""
from __future__ import annotations

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
from typing import IO

from course_tools.quiet import quiet_environ
from course_tools.sandbox.procs import Cgroup, SandboxPopen, SandboxProcesses, alive

__all__ = ["GiB", "MiB", "Limits", "SandboxUnavailable", "INSTALL_HINT", "KERNEL_NAME", "SANDBOX_CWD", "SANDBOX_HOME",
           "package_roots", "readonly_paths", "kernel_env", "check_available", "private_dir", "Cgroup", "KernelBox",
           "ScriptBox", "SandboxPopen", "folder_size"]

GiB = 2 ** 30
MiB = 2 ** 20
KERNEL_NAME = "course-grading"
SANDBOX_CWD = "/scratch"
SANDBOX_HOME = "/home/learner"
_CONN_LIMIT = 16 * MiB  # bytes the kernel may leave in its connection folder (sockets and the JSON are tiny)
_CONN_ENTRIES = 64

INSTALL_HINT = ("请先安装 bubblewrap: Debian/Ubuntu `sudo apt-get install bubblewrap`,Fedora `sudo dnf install "
                "bubblewrap`,Arch `sudo pacman -S bubblewrap`")

# Files of /etc a Python process needs; everything else there (shadow, ssh keys, ...) stays hidden.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "fonts", "passwd", "group", "nsswitch.conf",
        "localtime", "mime.types", "os-release", "hosts")

# Run by the kernel spec before bwrap (or the kernel itself with --no-sandbox): join the cgroup,
# set the limits, die with the grader, then exec. Python with -I -S: no site, no user paths.
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


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot build a sandbox here; ``str()`` is a Chinese explanation."""


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


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _packages() -> list[Path]:
    import course_tools
    import course_utils

    return [Path(m.__file__).resolve().parent for m in (course_utils, course_tools)]


@functools.lru_cache(maxsize=None)
def package_roots() -> tuple[Path, ...]:
    """The folders holding the course packages this (grader) process imported: ``PYTHONPATH`` inside."""
    return tuple(dict.fromkeys(p.parent for p in _packages()))


@functools.lru_cache(maxsize=None)
def readonly_paths() -> tuple[Path, ...]:
    """Host paths bound read-only into the sandbox, outermost first, none inside another."""
    wanted = [Path("/usr")] + [Path("/etc") / name for name in _ETC]
    wanted += [Path(p) for p in {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}]
    wanted += _packages()
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
                "LC_ALL": "C.UTF-8",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONNOUSERSITE": "1", "JUPYTER_PLATFORM_DIRS": "1",
                "PYTHONPATH": os.pathsep.join(str(p) for p in package_roots())})
    if threads:
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def _bwrap_args(limits: Limits, env: dict[str, str], writable: list[Path], readable: tuple[Path, ...] = (),
                cwd: str = SANDBOX_CWD, scripts: tuple[Path, ...] = ()) -> list[str]:
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


def _launcher(cfg: dict, command: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg), "--", *command]


def _launch_config(limits: Limits, env: dict[str, str] | None, cgroup: "Cgroup | None") -> dict:
    return {"cgroup_procs": [str(p) for p in (cgroup.procs if cgroup else [])], "env": env, "parent": os.getpid(),
            "rlimits": {"RLIMIT_AS": limits.memory, "RLIMIT_FSIZE": limits.file_size, "RLIMIT_CORE": 0}}


_AVAILABLE: dict[Limits, str] = {}


def _probe(limits: Limits, command: list[str]) -> subprocess.CompletedProcess:
    argv = ["bwrap", *_bwrap_args(limits, kernel_env(SANDBOX_HOME, "/tmp"), []), "--", *command]
    return subprocess.run(_launcher(_launch_config(limits, None, None), argv), capture_output=True, text=True,
                          timeout=120)


def _detail(out: subprocess.CompletedProcess) -> str:
    return " ".join((out.stderr or out.stdout).split())[-300:] or f"退出码 {out.returncode},没有输出"


def check_available(limits: Limits = Limits()) -> None:
    """Build one sandbox that imports the course packages; raise :class:`SandboxUnavailable` if that fails.

    The message names the true reason: bubblewrap missing, bubblewrap unable to create the
    namespaces (an empty sandbox running ``true`` fails too), or Python failing inside a sandbox that
    does start (its own error, e.g. a package the sandbox does not mount).
    """
    if limits in _AVAILABLE:
        if _AVAILABLE[limits]:
            raise SandboxUnavailable(_AVAILABLE[limits])
        return
    problem = ""
    if shutil.which("bwrap") is None:
        problem = f"找不到 bubblewrap(bwrap 命令),无法把学员代码关进沙箱。{INSTALL_HINT}。"
    else:
        try:
            out = _probe(limits, [sys.executable, "-c", "import course_utils, course_tools; print('sandbox-ok')"])
            if "sandbox-ok" not in out.stdout:
                empty = _probe(limits, [shutil.which("true") or "/usr/bin/true"])
                if empty.returncode == 0:
                    problem = (f"沙箱能创建,但沙箱里的 Python 启动失败: {_detail(out)}。评分器给沙箱挂载的是它自己导入的课程包"
                               f"({', '.join(str(p) for p in _packages())})和 Python 环境 {sys.prefix};"
                               "请检查这个环境能否在沙箱外 `python -c 'import course_utils, course_tools'`。")
                else:
                    problem = (f"bubblewrap 无法创建沙箱(隔离的命名空间): {_detail(empty)}。常见原因: 系统禁止非特权用户命名空间"
                               "(Debian/Ubuntu: `sudo sysctl -w kernel.unprivileged_userns_clone=1`;Ubuntu 24.04 还要 "
                               "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`),或在没有相应权限的容器里运行"
                               "(Docker 需要放开 seccomp/apparmor 对 unshare 的限制)。")
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"bubblewrap 无法启动: {exc}。"
    if problem:
        problem += "确实要在没有沙箱的情况下批改(学员代码能读写你的文件、读到参考答案、联网),请显式加 --no-sandbox。"
    _AVAILABLE[limits] = problem
    if problem:
        raise SandboxUnavailable(problem)


def private_dir() -> Path:
    """A fresh folder for one grading run's kernel boxes (``grade-<pid>-*`` in the temp folder, mode 0700).

    Folders and empty cgroups left by a grader that was killed (SIGKILL leaves no time to clean
    up; its kernels die with it) are removed first: same owner, the pid in the name gone.
    """
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob("grade-*-*"):
        parts = old.name.split("-")
        if (parts[1].isdigit() and not alive(int(parts[1])) and not old.is_symlink() and old.is_dir()
                and old.stat().st_uid == os.getuid()):
            shutil.rmtree(old, ignore_errors=True)
    try:
        Cgroup.sweep(Path("/proc/self/cgroup").read_text().splitlines())
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"grade-{os.getpid()}-"))


@dataclass
class KernelBox:
    """The private files and the kernel spec of one kernel run (outside the sandbox, mode 0700).

    ``private_dir`` is the grader's own folder; each box is a randomly named folder in it holding
    the kernel spec, the connection folder (``ip`` = socket path prefix) and, without the sandbox,
    the kernel's working folder, home and tmp.
    """

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
        self.cgroup = Cgroup.create(self.limits) if self.sandbox else None
        self.processes = SandboxProcesses(self.cgroup)
        if self.sandbox:
            self.cwd = str(self.dir)  # the launcher's cwd outside; inside, bwrap --chdir /scratch
            env = kernel_env(SANDBOX_HOME, "/tmp", self.threads)
            command = _launcher(_launch_config(self.limits, None, self.cgroup),
                                ["bwrap", *_bwrap_args(self.limits, env, [self.conn]), "--", sys.executable,
                                 "-m", "ipykernel_launcher", "-f", "{connection_file}"])
        else:
            for name in ("work", "home", "tmp"):
                (self.dir / name).mkdir()
            self.cwd = str(self.dir / "work")
            env = kernel_env(str(self.dir / "home"), str(self.dir / "tmp"), self.threads)
            command = _launcher(_launch_config(self.limits, env, None),
                                [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
        spec = self.kernels / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": command, "display_name": "course grading (sandboxed)" if self.sandbox else "course grading",
            "language": "python", "interrupt_mode": "message", "metadata": {"debugger": False}}))

    kernel_name = KERNEL_NAME

    def spec_manager(self):
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

    def started(self, pid: int) -> None:
        """The kernel manager started this box's kernel as ``pid`` (the launcher, then bwrap)."""
        self.processes.started(pid)

    def cpu_seconds(self) -> float:
        """CPU seconds the kernel's sandbox has used so far (0 before :meth:`started`)."""
        return self.processes.cpu_seconds()

    def end(self) -> list[int]:
        """SIGKILL every process of the kernel's sandbox and wait until none is alive (the pids left, if any)."""
        return self.processes.end()

    def close(self) -> None:
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
            command = _launcher(_launch_config(self.limits, None, cgroup),
                                ["bwrap", "--info-fd", str(info[1]),
                                 *_bwrap_args(self.limits, inner, [writable], self.readable, str(cwd), self.scripts),
                                 "--", *argv])
            where, fds = None, (info[1],)
        else:
            home = writable.parent / f".{writable.name}.home"
            home.mkdir(exist_ok=True)
            inner = {**kernel_env(str(home), str(home), self.threads), **own}
            command, where = _launcher(_launch_config(self.limits, inner, None), argv), cwd
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
