"""The resume doctor's fork server: start a recorded run by forking a process that has already imported torch.

What: ``python forks.py`` (started by :class:`ForkServer` with the command's interpreter, flags and
environment) imports torch, numpy and the probe once, says ``ready``, then reads one JSON request a
line (``{"id", "argv", "log"}``: the probe's arguments and the log file) and forks a child per request.
The child starts its own session, writes to the log, re-seeds Python's, NumPy's and torch's global
generators from the OS (a fresh interpreter seeds them when it imports them: torch 2.14.1's
``torch.initial_seed()`` differs from one ``python -c "import torch"`` to the next) and runs
:func:`course_utils.resume_doctor.probe.main`; its exit ends like an interpreter's (``atexit``, flushed
output, the script's exit status). The server reports ``started ID PID`` and ``exited PID CODE``
(``-9``: killed by SIGKILL, as ``subprocess`` says it).

Why: a doctor run starts eight training processes, and most of a tiny run's time is start-up: ``import
torch`` and the ``torch._dynamo`` that the first optimizer imports (4.4 s and 4.8 s of a zoo run's 12.9 s
under cProfile, AMD EPYC at load 5-8, 2026-12-06). Forking pays them once.

Pitfall: what a fork shares that fresh interpreters do not. The hash seed of ``str`` (``PYTHONHASHSEED``)
is the server's in every child, and whatever the script does before ``import torch`` comes too late to
change how torch was imported (an ``OMP_NUM_THREADS`` set in the script). So the uninterrupted run, which
every chain is compared with, still starts in a fresh interpreter: a script that depends on either may
differ from it, and where that shows in the weights or the batches before its first kill, the doctor
says the script is not reproducible.
``--fresh`` starts every process fresh.

Reference machinery of the resume doctor's command line (:mod:`course_utils.resume_doctor.cli`), which
13's ``course_tools/lab/capstone.py`` runs on the learner's trainer.

Example::

    server = ForkServer(["python"], env, Path("w/forks.log"))
    code = server.run(["--record", "w/p0.jsonl", "--", "train.py", "--out", "w/run"], Path("w/p0.log"), 600)
"""
from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["ForkServer", "serve"]

FORKS = Path(__file__).resolve()


def _reap(reply: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        os.write(reply, f"exited {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


def serve() -> dict[str, Any] | None:
    """The server's loop; returns a request in a forked child, None in the server when the doctor hangs up."""
    import numpy  # noqa: F401  what the scripts import first, imported once here
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  the first torch.optim optimizer built imports it (as long as torch itself)
    import torch.optim  # noqa: F401
    from course_utils.resume_doctor import probe  # noqa: F401

    requests, reply = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.write(reply, b"ready\n")
    pending = b""
    while True:
        if select.select([requests], [], [], 0.05)[0]:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                return None
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os.close(requests)
                    os.close(reply)
                    return request
                os.write(reply, f"started {request['id']} {pid}\n".encode())
        _reap(reply)


def _child(request: dict[str, Any]) -> None:
    """In the forked child: a session and a log of its own, fresh global generators, then the probe and the script."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    random.seed()
    sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()  # torch 2.14 seeds its global generator anew in each fresh interpreter, too
    from course_utils.resume_doctor import probe

    probe.main(request["argv"])


class ForkServer:
    """The doctor's end: start the server, fork runs from it, wait for their exit codes (from any thread)."""

    def __init__(self, python: list[str], env: dict[str, str], log: Path) -> None:
        with open(log, "w", encoding="utf-8") as errors:
            self.proc = subprocess.Popen([*python, str(FORKS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=errors, env=env, start_new_session=True)
        self.cond = threading.Condition()
        self.ready, self.closed, self.next_id = False, False, 0
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            words = line.split()
            with self.cond:
                if words == [b"ready"]:
                    self.ready = True
                elif len(words) == 3:
                    (self.pids if words[0] == b"started" else self.codes)[int(words[1])] = int(words[2])
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def usable(self, timeout: float) -> bool:
        """Wait until the server has imported torch; False when it could not in ``timeout`` s (then start fresh ones)."""
        with self.cond:
            self.cond.wait_for(lambda: self.ready or self.closed, timeout)
            return self.ready and not self.closed

    def run(self, argv: list[str], log: Path, timeout: float) -> int | None:
        """Fork one probe run with ``argv``; its exit code, or None when it ran past ``timeout`` (then killed)."""
        with self.cond:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.proc.stdin.write(json.dumps({"id": rid, "argv": argv, "log": str(log)}).encode() + b"\n")
            self.proc.stdin.flush()
            self.cond.wait_for(lambda: rid in self.pids or self.closed)
            if rid not in self.pids:
                raise RuntimeError(f"the fork server ended: {self.proc.wait()}")
            pid = self.pids.pop(rid)
            ended = self.cond.wait_for(lambda: pid in self.codes or self.closed, timeout)
            if not ended:
                os.killpg(pid, signal.SIGKILL)
                self.cond.wait_for(lambda: pid in self.codes or self.closed)
            code = self.codes.pop(pid, None)
        try:  # DataLoader workers and whatever else the script left behind
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return code if ended else None

    def close(self) -> None:
        """Hang up: the server ends (its runs have ended); killed if it does not within a few seconds."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


if __name__ == "__main__":
    # Run from this file's path, like probe.py: import the package's modules.
    sys.path[0] = str(FORKS.parents[2])
    from course_utils.resume_doctor import forks

    got = forks.serve()
    if got is not None:
        forks._child(got)
