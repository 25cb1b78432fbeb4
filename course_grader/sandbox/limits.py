"""What one sandbox may use (:class:`Limits`), and the launcher stub that applies it before bwrap.

The stub (``python -I -S``: no site, no user paths) joins the cgroup, sets ``RLIMIT_AS`` (``import torch`` alone
maps ~3.4 GiB: default 6 GiB), ``RLIMIT_FSIZE`` and no core files, dies with the grader (``PR_SET_PDEATHSIG``;
at once if it is already gone), then execs bwrap (``--no-sandbox``: the command, in the scrubbed environment).

Example::

    argv = launcher_command(launch_config(Limits(), None, cgroup), ["bwrap", *bwrap_args(...), "--", *command])
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_grader.sandbox.procs import Cgroup

__all__ = ["GiB", "MiB", "Limits", "launcher_command", "launch_config"]

GiB = 2 ** 30
MiB = 2 ** 20

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
