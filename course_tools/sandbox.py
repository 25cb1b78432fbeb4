"""One Jupyter kernel per graded notebook, started inside a bubblewrap sandbox (instructor tool).

The grader never trusts the learner's kernel with anything it could abuse. The kernel is started
through a kernel spec whose command is ``bwrap`` (Debian package ``bubblewrap``):

- the root file system is an empty tmpfs with only what Python needs bound read-only: ``/usr``,
  a few files of ``/etc`` (no ``shadow``, no keys), the Python installation, the virtual
  environment and the two course packages (``course_utils``, ``course_tools``) at their real
  paths, so the editable install keeps working. Nothing else of the repository exists inside:
  no ``solutions/``, ``.git``, ``tests/``, submissions, reports or grader files;
- writable: ``/scratch`` (the working folder), ``/tmp``, ``/dev/shm`` and an empty ``$HOME``, all
  tmpfs with a size cap, gone when the kernel exits; the rest of the tree is read-only;
- a scrubbed environment (``--clearenv``: only PATH, HOME, the quiet settings);
- new PID, network, IPC, UTS and user namespaces: the kernel sees only its own processes, every
  process it starts dies with the sandbox, and there is no network. The kernel talks to the grader
  over Unix sockets (jupyter_client's ``ipc`` transport) in a private folder bound into the sandbox:
  TCP ports inside a network namespace are unreachable from outside, Unix sockets are not;
- limits: ``RLIMIT_AS`` (address space per process; ``import torch`` alone maps about 3.4 GiB, so
  the default is 6 GiB), ``RLIMIT_FSIZE``, no core files, and a memory + pids cgroup where one is
  writable; the kernel dies with the grader (``PR_SET_PDEATHSIG``) and the sandbox with its
  launcher (``--die-with-parent``);
- ``interrupt_mode: message``: an interrupt is a message, never a signal to the sandbox's process
  group (which would kill the sandbox).

The one host folder the kernel can write is its connection folder (the sockets must be created
there); the grader watches its size while the kernel runs (:meth:`KernelBox.connection_abuse`)
and deletes it afterwards. ``--no-sandbox`` runs the same kernel without bwrap (same scrubbed
environment, same limits, ``ipc`` transport) for trusted code and for measuring the sandbox's cost.

Example::

    check_available()                      # raises SandboxUnavailable with a Chinese message
    box = KernelBox(private_dir, Limits(), threads=1)
    # AsyncKernelManager(kernel_name=box.kernel_name, kernel_spec_manager=box.spec_manager(),
    #                    transport="ipc", ip=box.ip, connection_file=box.connection_file)
    box.close()
"""
from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_tools.quiet import quiet_environ

__all__ = ["GiB", "Limits", "SandboxUnavailable", "INSTALL_HINT", "KERNEL_NAME", "SANDBOX_CWD", "SANDBOX_HOME",
           "readonly_paths", "kernel_env", "check_available", "private_dir", "Cgroup", "KernelBox"]

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
    """Resource limits of one kernel. ``memory`` is RLIMIT_AS per process and the cgroup's memory limit."""

    memory: int = 6 * GiB
    scratch: int = 2 * GiB
    tmp: int = 1 * GiB
    home: int = 256 * MiB
    shm: int = 1 * GiB
    file_size: int = 2 * GiB
    pids: int = 512


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


@functools.lru_cache(maxsize=None)
def readonly_paths() -> tuple[Path, ...]:
    """Host paths bound read-only into the sandbox, outermost first, none inside another."""
    import course_tools
    import course_utils

    wanted = [Path("/usr")] + [Path("/etc") / name for name in _ETC]
    wanted += [Path(p) for p in {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}]
    wanted += [Path(m.__file__).resolve().parent for m in (course_utils, course_tools)]
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
                "PYTHONNOUSERSITE": "1", "JUPYTER_PLATFORM_DIRS": "1"})
    if threads:
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def _bwrap_args(limits: Limits, conn: Path, env: dict[str, str]) -> list[str]:
    # The tmpfs mounts come first: a virtual environment under /tmp (CI's mktemp venv) is bound on top.
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
    args += ["--bind", str(conn), str(conn), "--chdir", SANDBOX_CWD,
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


def check_available(limits: Limits = Limits()) -> None:
    """Build one sandbox that imports the course packages; raise :class:`SandboxUnavailable` if that fails."""
    if limits in _AVAILABLE:
        if _AVAILABLE[limits]:
            raise SandboxUnavailable(_AVAILABLE[limits])
        return
    problem = ""
    if shutil.which("bwrap") is None:
        problem = f"找不到 bubblewrap(bwrap 命令),无法把学员代码关进沙箱。{INSTALL_HINT}。"
    else:
        conn = Path(tempfile.mkdtemp(prefix="grade-probe-"))
        try:
            command = ["bwrap", *_bwrap_args(limits, conn, kernel_env(SANDBOX_HOME, "/tmp")), "--",
                       sys.executable, "-c", "import course_utils, course_tools; print('sandbox-ok')"]
            out = subprocess.run(_launcher(_launch_config(limits, None, None), command), capture_output=True,
                                 text=True, timeout=120)
            if "sandbox-ok" not in out.stdout:
                detail = " ".join((out.stderr or out.stdout).split())[-300:]
                problem = (f"bubblewrap 无法创建沙箱(隔离的命名空间): {detail}。常见原因: 系统禁止非特权用户命名空间"
                           "(Debian/Ubuntu: `sudo sysctl -w kernel.unprivileged_userns_clone=1`;Ubuntu 24.04 还要 "
                           "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`),或在没有相应权限的容器里运行"
                           "(Docker 需要放开 seccomp/apparmor 对 unshare 的限制)。")
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"bubblewrap 无法启动: {exc}。"
        finally:
            shutil.rmtree(conn, ignore_errors=True)
    if problem:
        problem += "确实要在没有沙箱的情况下批改(学员代码能读写你的文件、读到参考答案、联网),请显式加 --no-sandbox。"
    _AVAILABLE[limits] = problem
    if problem:
        raise SandboxUnavailable(problem)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def private_dir() -> Path:
    """A fresh folder for one grading run's kernel boxes (``grade-<pid>-*`` in the temp folder, mode 0700).

    Folders and empty cgroups left by a grader that was killed (SIGKILL leaves no time to clean
    up; its kernels die with it) are removed first: same owner, the pid in the name gone.
    """
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob("grade-*-*"):
        parts = old.name.split("-")
        if (parts[1].isdigit() and not _alive(int(parts[1])) and not old.is_symlink() and old.is_dir()
                and old.stat().st_uid == os.getuid()):
            shutil.rmtree(old, ignore_errors=True)
    try:
        Cgroup.sweep(Path("/proc/self/cgroup").read_text().splitlines())
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"grade-{os.getpid()}-"))


@dataclass
class Cgroup:
    """A child cgroup (v2, or v1 memory + pids) limiting one sandbox's memory and process count."""

    dirs: list[Path]
    procs: list[Path]

    @classmethod
    def create(cls, limits: Limits) -> "Cgroup | None":
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
                settings = {"memory.max": limits.memory, "memory.swap.max": 0, "pids.max": limits.pids}
            else:  # v1: one hierarchy per controller
                where = {}
                for line in lines:
                    _, controllers, path = line.split(":", 2)
                    for c in controllers.split(","):
                        where[c] = path.lstrip("/")
                if "memory" not in where:
                    return None
                settings = {}
                for controller, key, value in (("memory", "memory.limit_in_bytes", limits.memory),
                                               ("pids", "pids.max", limits.pids)):
                    if controller in where and (root / controller).is_dir():
                        made.append(root / controller / where[controller] / name)
                        made[-1].mkdir()
                        settings[str(made[-1] / key)] = value
            for key, value in settings.items():
                target = Path(key) if os.path.isabs(key) else made[0] / key
                if target.exists():
                    target.write_text(str(value))
            return cls(made, [d / "cgroup.procs" for d in made])
        except (OSError, StopIteration, ValueError, IndexError):
            cls(made, []).close()
            return None

    @staticmethod
    def sweep(lines: list[str]) -> None:
        """Remove empty cgroups left by a grader that was killed (rmdir fails on a non-empty one)."""
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for c in (controllers.split(",") if controllers else [""]):
                parent = Path("/sys/fs/cgroup") / c / path.lstrip("/")
                for old in parent.glob("course-grade-*-*") if parent.is_dir() else []:
                    pid = old.name.split("-")[2]
                    if pid.isdigit() and not _alive(int(pid)):
                        try:
                            old.rmdir()
                        except OSError:
                            pass

    def close(self) -> None:
        for d in reversed(self.dirs):
            for _ in range(50):  # the last processes may still be exiting
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


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
        if self.sandbox:
            self.cwd = str(self.dir)  # the launcher's cwd outside; inside, bwrap --chdir /scratch
            env = kernel_env(SANDBOX_HOME, "/tmp", self.threads)
            command = _launcher(_launch_config(self.limits, None, self.cgroup),
                                ["bwrap", *_bwrap_args(self.limits, self.conn, env), "--", sys.executable,
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

    def close(self) -> None:
        if self.cgroup:
            self.cgroup.close()
        shutil.rmtree(self.dir, ignore_errors=True)
