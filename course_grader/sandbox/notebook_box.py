"""The notebook box: the private files and the kernel spec of one sandboxed Jupyter kernel.

Part of :mod:`course_grader.sandbox`. A :class:`KernelBox` is a randomly named folder (mode 0700) in
the grader's private folder holding the kernel spec (whose command is the launcher stub, then
``bwrap`` with the mounts of :mod:`course_grader.sandbox.mounts`, then ``ipykernel``), the connection
folder (the kernel talks to the grader over Unix sockets there: jupyter_client's ``ipc`` transport,
since TCP ports inside a network namespace are unreachable from outside) and its own cgroup. The
connection folder is the one host folder the kernel can write; :meth:`KernelBox.connection_abuse`
watches its size. ``interrupt_mode: message``: an interrupt is a message, never a signal to the
sandbox's process group (which would kill the sandbox). ``sandbox=False`` (``--no-sandbox``): the
same kernel, environment and limits without bwrap, its working folder, home and tmp in the box.

Example::

    box = KernelBox(private_dir(), Limits(), threads=1)
    # AsyncKernelManager(kernel_name=box.kernel_name, kernel_spec_manager=box.spec_manager(),
    #                    transport="ipc", ip=box.ip, connection_file=box.connection_file)
    box.started(km.provisioner.pid)        # then box.cpu_seconds() is the kernel's CPU clock
    box.close()                            # every process of the sandbox killed and gone
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from course_grader.sandbox.cgroup import Cgroup
from course_grader.sandbox.limits import MiB, Limits, launch_config, launcher_command
from course_grader.sandbox.mounts import SANDBOX_HOME, bwrap_args, kernel_env
from course_grader.sandbox.procs import SandboxProcesses

if TYPE_CHECKING:
    from jupyter_client.kernelspec import KernelSpecManager

__all__ = ["KERNEL_NAME", "KernelBox"]

KERNEL_NAME = "course-grading"
_CONN_LIMIT = 16 * MiB  # bytes the kernel may leave in its connection folder (sockets and the JSON are tiny)
_CONN_ENTRIES = 64


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
            command = launcher_command(launch_config(self.limits, None, self.cgroup),
                                       ["bwrap", *bwrap_args(self.limits, env, [self.conn]), "--", sys.executable,
                                        "-m", "ipykernel_launcher", "-f", "{connection_file}"])
        else:
            for name in ("work", "home", "tmp"):
                (self.dir / name).mkdir()
            self.cwd = str(self.dir / "work")
            env = kernel_env(str(self.dir / "home"), str(self.dir / "tmp"), self.threads)
            command = launcher_command(launch_config(self.limits, env, None),
                                       [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
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
        """End the kernel's sandbox, remove its cgroup and the box's folder."""
        self.end()
        if self.cgroup:
            self.cgroup.close()
        shutil.rmtree(self.dir, ignore_errors=True)
