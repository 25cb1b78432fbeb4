"""Bubblewrap sandboxes for learner code: a kernel per graded notebook (:class:`KernelBox`), a sandbox per
homework script run (:class:`ScriptBox`).

Each sandbox: new PID, network, IPC, UTS and user namespaces, ``--clearenv`` and an empty read-only root with
only what Python needs (:mod:`.boxes`); rlimits and a memory + pids cgroup, every process killed and waited for
when it ends (:mod:`.procs`). ``--no-sandbox`` runs the same without bwrap (trusted code only).
:func:`check_available` raises :class:`SandboxUnavailable` with the true reason.

Example::

    check_available()
    box = KernelBox(private_dir(), Limits(), threads=1)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# ``_bwrap_args``: the name the tests use for the mounts' command line
from course_grader.sandbox.boxes import (SANDBOX_CWD, SANDBOX_HOME, KernelBox, ScriptBox, box_command,
                                         bwrap_args as _bwrap_args, course_packages, kernel_env, readonly_paths)
from course_grader.sandbox.procs import GiB, MiB, Cgroup, Limits, SandboxPopen, alive

__all__ = ["GiB", "MiB", "Limits", "SandboxUnavailable", "SANDBOX_CWD", "readonly_paths", "kernel_env",
           "check_available", "private_prefix", "private_dir", "Cgroup", "KernelBox", "ScriptBox", "SandboxPopen"]

INSTALL_HINT = ("请先安装 bubblewrap: Debian/Ubuntu `sudo apt-get install bubblewrap`,Fedora `sudo dnf install "
                "bubblewrap`,Arch `sudo pacman -S bubblewrap`")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot build a sandbox here; ``str()`` is a Chinese explanation."""


_AVAILABLE: dict[Limits, str] = {}


def _probe(limits: Limits, command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(box_command(limits, kernel_env(SANDBOX_HOME, "/tmp"), command), capture_output=True,
                          text=True, timeout=120)


def _detail(out: subprocess.CompletedProcess) -> str:
    return " ".join((out.stderr or out.stdout).split())[-300:] or f"退出码 {out.returncode},没有输出"


def check_available(limits: Limits = Limits()) -> None:
    """Build one sandbox that imports the course packages, else raise :class:`SandboxUnavailable` naming the true
    reason: bubblewrap missing, no namespaces (an empty sandbox fails too), or Python failing inside."""
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
    """A fresh folder (mode 0700) for one grading run's boxes, after removing the folders and empty cgroups of
    killed graders (same owner, the pid in the name gone)."""
    for old in Path(tempfile.gettempdir()).glob("grade-*-*"):
        parts = old.name.split("-")
        if (parts[1].isdigit() and not alive(int(parts[1])) and not old.is_symlink() and old.is_dir()
                and old.stat().st_uid == os.getuid()):
            shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):
        Cgroup.sweep(Path("/proc/self/cgroup").read_text().splitlines())
    return Path(tempfile.mkdtemp(prefix=private_prefix(os.getpid())))
