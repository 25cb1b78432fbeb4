"""Bubblewrap sandboxes for learner code: one Jupyter kernel per graded notebook, one sandbox per run of a
homework script (instructor tool).

The grader never trusts the learner's code with anything it could abuse. Kernels are started through
a kernel spec whose command is ``bwrap`` (Debian package ``bubblewrap``): :class:`KernelBox`
(:mod:`course_grader.sandbox.notebook_box`); homework scripts through :class:`ScriptBox`
(:mod:`course_grader.sandbox.script_box`), the launcher the homework checks
(:mod:`course_tools.checks.nb10_homework`) call. Both get the same mounts, environment and limits:

- the root file system (:mod:`course_grader.sandbox.mounts`) is an empty tmpfs with only what
  Python needs bound read-only, each at its real path: ``/usr``, a few files of ``/etc`` (no
  ``shadow``, no keys), the Python installation, the virtual environment (``sys.prefix``; in the
  README's layout that is ``.venv`` in the repository root, so the kernel sees ``.venv`` beside the
  two packages) and the two course packages (``course_utils``, ``course_tools``) that the GRADER
  imported. Nothing else of the repository exists inside: no ``solutions/``, ``.git``, ``tests/``,
  submissions, reports or grader files. ``PYTHONPATH`` inside is the folder holding the grader's packages, so the sandbox imports
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
- limits (:mod:`course_grader.sandbox.limits`): ``RLIMIT_AS`` (address space per process; ``import
  torch`` alone maps about 3.4 GiB, so the default is 6 GiB), ``RLIMIT_FSIZE``, no core files, and a
  memory + pids cgroup where one is writable (:mod:`course_grader.sandbox.cgroup`); the sandbox dies
  with the grader (``PR_SET_PDEATHSIG``) and with its launcher (``--die-with-parent``): ``os.killpg``
  of the process a :class:`ScriptBox` returns ends the whole sandbox, and that process's ``wait()``
  returns once all of it is gone;
- CPU time: each box counts the CPU seconds its sandbox uses (the cgroup's counter, else the
  process tree's), for limits that do not depend on the machine's load; ``KernelBox.end`` and the
  runs' ``wait`` SIGKILL every process of the sandbox and wait for them
  (:mod:`course_grader.sandbox.procs`);
- ``interrupt_mode: message``: an interrupt is a message, never a signal to the sandbox's process
  group (which would kill the sandbox).

The one host folder a kernel can write is its connection folder (the sockets must be created
there); the grader watches its size while the kernel runs (:meth:`KernelBox.connection_abuse`)
and deletes it afterwards. ``--no-sandbox`` runs the same kernels and scripts without bwrap (same
scrubbed environment, same limits, ``ipc`` transport) for trusted code and for measuring the
sandbox's cost.

This module is the front door: :func:`check_available` (can a sandbox be built here? raises
:class:`SandboxUnavailable` with the true reason, in Chinese), :func:`private_dir` (a grading run's own
folder, after sweeping what a killed grader left) and every name a caller needs.

Example::

    check_available()                      # raises SandboxUnavailable with a Chinese message
    box = KernelBox(private_dir(), Limits(), threads=1)
    scripts = ScriptBox(scripts=(scratch,))   # a homework check's launcher
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from course_grader.sandbox.cgroup import Cgroup, alive
from course_grader.sandbox.limits import GiB, MiB, Limits, launch_config, launcher_command
# ``_bwrap_args``: the name the tests and :func:`_probe` use for the mounts' command line
from course_grader.sandbox.mounts import (SANDBOX_CWD, SANDBOX_HOME, bwrap_args as _bwrap_args, course_packages,
                                         kernel_env, package_roots, readonly_paths)
from course_grader.sandbox.notebook_box import KERNEL_NAME, KernelBox
from course_grader.sandbox.procs import SandboxPopen, SandboxProcesses
from course_grader.sandbox.script_box import ScriptBox, folder_size

__all__ = ["GiB", "MiB", "Limits", "SandboxUnavailable", "INSTALL_HINT", "KERNEL_NAME", "SANDBOX_CWD", "SANDBOX_HOME",
           "package_roots", "readonly_paths", "kernel_env", "check_available", "private_prefix", "private_dir", "Cgroup", "KernelBox",
           "ScriptBox", "SandboxPopen", "SandboxProcesses", "folder_size"]

INSTALL_HINT = ("请先安装 bubblewrap: Debian/Ubuntu `sudo apt-get install bubblewrap`,Fedora `sudo dnf install "
                "bubblewrap`,Arch `sudo pacman -S bubblewrap`")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot build a sandbox here; ``str()`` is a Chinese explanation."""


_AVAILABLE: dict[Limits, str] = {}


def _probe(limits: Limits, command: list[str]) -> subprocess.CompletedProcess:
    argv = ["bwrap", *_bwrap_args(limits, kernel_env(SANDBOX_HOME, "/tmp"), []), "--", *command]
    return subprocess.run(launcher_command(launch_config(limits, None, None), argv), capture_output=True, text=True,
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
                               f"({', '.join(str(p) for p in course_packages())})和 Python 环境 {sys.prefix};"
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


def private_prefix(pid: int) -> str:
    """The name prefix of grader ``pid``'s private folders: its kernels' command lines carry ``/<prefix>``."""
    return f"grade-{pid}-"


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
    return Path(tempfile.mkdtemp(prefix=private_prefix(os.getpid())))
