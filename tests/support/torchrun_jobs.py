"""Jobs of the professional script under torchrun, for the tests: start one, find its processes, kill it whole.

Every process of a job (the agent, the ranks, their DataLoader workers) carries ``MARKER=<job>`` in its
environment, so a test counts only its own processes on a busy machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.support.pro_runs import SCRIPT, STEPS_PER_EPOCH, TINY, shared_run

ARGS = [*TINY, "--epochs", "2", "--ckpt-every-steps", "3", "--log-every", "1", "--workers", "1"]
TOTAL_STEPS = 2 * STEPS_PER_EPOCH  # 2 epochs of 15 global batches of 32 (16 per process)
MARKER = "COURSE_DDP_TEST_JOB"  # in the environment of every process of a job: the agent, the ranks, their workers


def launch(out: Path, *args: str, nproc: int = 2, launcher: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start the script under torchrun (``nproc`` = 0: plain python); returns (process, the job's marker)."""
    job = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", MARKER: job}
    head = [sys.executable] if nproc == 0 else \
        [sys.executable, "-m", "torch.distributed.run", *(launcher or ["--standalone", "--nproc-per-node", str(nproc)])]
    proc = subprocess.Popen([*head, str(SCRIPT), "--out", str(out), *ARGS, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    return proc, job


def shared_job(tmp_path_factory, name: str, *args: str) -> Path:
    """The finished two-process job of ``ARGS`` + ``args`` (one launcher), made once per session and shared by every
    test file and xdist worker (``pro_runs.shared_run``). Read it; copy it before running in it."""
    return shared_run(tmp_path_factory, name, list(args), launch=lambda out, *extra: launch(out, *extra)[0])


def job_processes(job: str) -> dict[int, dict[str, str]]:
    """Live (not zombie) processes of ``job``: pid -> {"ppid", "RANK"}."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone, or not ours
            continue
        if f"{MARKER}={job}".encode() in environ:
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                rank = [v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"RANK=")]
                found[int(entry)] = {"ppid": fields[1], "RANK": rank[0] if rank else ""}
    return found


def kill_job(proc: subprocess.Popen, job: str) -> int:
    """SIGKILL every process of the job, all at once: frozen first (SIGSTOP, until no new one appears), so that
    none reacts to another's death (the agent tearing down, a rank starting workers). Returns how many."""
    frozen: set[int] = set()
    while new := set(job_processes(job)) - frozen:
        for pid in new:
            os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while (alive := job_processes(job)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes of the killed job survived: {alive}"
    return len(frozen)
