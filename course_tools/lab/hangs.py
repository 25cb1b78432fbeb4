"""The machinery behind section 10 of ``11_multi_process``: one rank frozen live, the watchdog's verdict, the resume.

Reference machinery, not taught: the notebook shows what a learner must read (the heartbeats while the job is
stuck, status.json, the report, the stacks, the losses) and calls :func:`freeze_rank` for the rest, on the jobs of
section 9 (``course_tools.lab.multi_process``). Why a helper: every moment is an event it waits for (a step logged,
rank 0 waiting, the job's end), never a fixed sleep alone, so a busy machine changes the durations, not the
outcome. Pitfall: the sampling window must end well before ``--hang-timeout`` runs out, or the watchdog ends the
job while it is being watched (``settle_s + watch_s < hang_timeout - 1``, checked before any job starts). Example::

    job = freeze_rank(freeze_at=8, hang_timeout=6)    # a FrozenJob
    job.report["message"], job.returncode             # the watchdog's one line; torchrun's exit code (1)
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from course_tools.lab.multi_process import (PRO_SCRIPT, ResumedJob, _alive, _job_processes, _resume, _side_by_side,
                                            _statuses, _train_losses, fresh, torchrun_command)
from course_utils.heartbeat import read_heartbeats
from course_utils.runfolder import RunFiles, read_status

__all__ = ["FrozenJob", "freeze_rank", "main_thread_frames"]

T = TypeVar("T")
_REPO = PRO_SCRIPT.parents[2]  # the repository root (PRO_SCRIPT: solutions/homework/train_cifar_pro.py)


@dataclass(frozen=True)
class FrozenJob(ResumedJob):
    """What :func:`freeze_rank` measured."""

    command: list[str]                 # the frozen job's torchrun command (the resume adds --resume)
    frozen_pid: int                    # rank 1's process, found through its heartbeat and its RANK variable
    frozen_after: int                  # the last step in metrics.jsonl when rank 1 was stopped
    samples: list[dict[str, Any]]      # while stuck: t (s into the window), per rank step, phase, in_phase, stamp_age
    window_s: float                    # how long the window lasted (output sizes measured at both ends)
    output_growth: int                 # bytes added to the job's log and metrics.jsonl during the window
    alive_in_window: int               # processes of the job alive at the end of the window (agent + ranks)
    rank1_state: str                   # psutil's status of rank 1 at the end of the window ("stopped")
    returncode: int | None             # torchrun's exit code
    ended_after_s: float               # from the stop to torchrun's exit
    status: dict[str, Any]             # status.json as the hung job left it
    report: dict[str, Any]             # hangs/<time>-step<N>/report.json
    stacks_rank0: str                  # rank 0's stacks_rank0.txt (every thread)
    leftovers: list[int]               # processes of the hung job still alive after its end


def _wait_for(found: Callable[[], T | None], timeout: float, what: str, log: Path) -> T:
    """Poll ``found()`` every 50 ms until it returns something; after ``timeout`` s a RuntimeError with the log tail."""
    deadline = time.monotonic() + timeout
    while (value := found()) is None:
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else "(没有输出)"
            raise RuntimeError(f"{timeout:.0f} s 内没有等到:{what}。作业输出的最后几行:\n{tail}")
        time.sleep(0.05)
    return value


def _rank_pid(agent: subprocess.Popen, out: Path, rank: int) -> int | None:
    """The pid in ``rank``'s heartbeat, once it is a process of this job whose environment says RANK=rank."""
    import psutil

    beat = read_heartbeats(RunFiles(out).heartbeats).get(rank)
    process = _job_processes(agent).get(beat["pid"]) if beat else None
    try:
        return beat["pid"] if process is not None and process.environ().get("RANK") == str(rank) else None
    except psutil.Error:
        return None


def _row(beats: dict[int, dict[str, Any]], now: float, t: float) -> dict[str, Any]:
    row: dict[str, Any] = {"t": round(t, 2)}
    for r, b in sorted(beats.items()):
        row[r] = {"step": b["step"], "phase": b["phase"], "in_phase": now - b["since"], "stamp_age": now - b["stamped"]}
    return row


def _watch(job: subprocess.Popen, out: Path, log: Path, settle_s: float, watch_s: float) -> dict[str, Any]:
    """Once rank 0 has stayed ``settle_s`` in one phase and rank 1's heartbeat is as old: sample every rank's
    heartbeat for ``watch_s`` s, with the growth of the job's output and the processes alive at the end."""
    def waiting() -> dict[int, dict[str, Any]] | None:
        beats, now = read_heartbeats(RunFiles(out).heartbeats), time.time()
        ready = {0, 1} <= beats.keys() and now - beats[0]["since"] >= settle_s and now - beats[1]["stamped"] >= settle_s
        return beats if ready else None

    _wait_for(waiting, 60, f"rank 0 在同一个阶段停留 {settle_s:g} s", log)
    outputs = (log, RunFiles(out).metrics)
    size_before, start, samples = sum(p.stat().st_size for p in outputs), time.monotonic(), []
    while (t := time.monotonic() - start) < watch_s and job.poll() is None:
        samples.append(_row(read_heartbeats(RunFiles(out).heartbeats), time.time(), t))
        time.sleep(0.25)
    window_s, processes = time.monotonic() - start, _job_processes(job)
    return {"samples": samples, "window_s": window_s,
            "rank1_state": _statuses(processes).get(_rank_pid(job, out, 1), "gone"),
            "output_growth": sum(p.stat().st_size for p in outputs) - size_before,
            "alive_in_window": len(_alive(processes))}


def _hang_outcome(job: subprocess.Popen, out: Path, log: Path, stopped_at: float, timeout: float,
                  processes: dict[int, Any]) -> dict[str, Any]:
    """Wait for the hung job's end; what it left: status.json, the report, rank 0's stacks, leftover processes."""
    _wait_for(lambda: job.poll(), timeout, "看门狗结束卡住的作业", log)
    ended_after_s = time.monotonic() - stopped_at
    deadline = time.monotonic() + 10
    while (leftovers := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.05)
    status = read_status(out, check_alive=False)
    folder = Path(status.get("hang_folder", RunFiles(out).hangs))
    if not (folder / "report.json").is_file():
        raise RuntimeError(f"作业结束了(退出码 {job.returncode}),但没有看门狗的报告 {folder}/report.json:\n"
                           + log.read_text(errors="replace")[-1500:])
    return {"returncode": job.returncode, "ended_after_s": ended_after_s, "status": status, "leftovers": leftovers,
            "report": json.loads((folder / "report.json").read_text()),
            "stacks_rank0": (folder / "stacks_rank0.txt").read_text(errors="replace")}


def freeze_rank(script: Path = PRO_SCRIPT, freeze_at: int = 8, hang_timeout: float = 6, fraction: float = 0.1,
                settle_s: float = 1.0, watch_s: float = 2.0, timeout: float = 300) -> FrozenJob:
    """Run a reference job and a job with ``--hang-timeout hang_timeout`` side by side (2 ranks each, one thread);
    ``SIGSTOP`` rank 1 of the second once its metrics.jsonl reaches step ``freeze_at``; watch it stuck; let the
    watchdog end it; resume it with ``--resume``. Every process of both jobs is killed if anything fails."""
    if settle_s + watch_s >= hang_timeout - 1:
        raise ValueError(f"settle_s + watch_s 必须比 hang_timeout 少 1 秒以上,实际 {settle_s + watch_s:g} 与 {hang_timeout:g}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref_dir, out = fresh("hang_reference") / "run", fresh("hang_frozen") / "run"
    command = torchrun_command(script, out, "--hang-timeout", f"{hang_timeout:g}", fraction=fraction)
    log = out.parent / "log.txt"
    start = time.perf_counter()
    with _side_by_side(script, ref_dir, out, command, fraction, env) as (ref_job, job):
        _wait_for(lambda: max(_train_losses(out), default=0) >= freeze_at or None, timeout,
                  f"metrics.jsonl 记到第 {freeze_at} 步", log)
        frozen_pid = _wait_for(lambda: _rank_pid(job, out, 1), 30, "rank 1 的心跳文件", log)
        processes = _job_processes(job)  # agent and both ranks: none may be left after the job's end
        os.kill(frozen_pid, signal.SIGSTOP)
        stopped_at, frozen_after = time.monotonic(), max(_train_losses(out))
        watched = _watch(job, out, log, settle_s, watch_s)
        ended = _hang_outcome(job, out, log, stopped_at, timeout, processes)
        resumed = _resume(command, out, ref_job, ref_dir, env, timeout, start)
    return FrozenJob(command=command, frozen_pid=frozen_pid, frozen_after=frozen_after, **watched, **ended, **resumed)


def _short(path: str) -> str:
    """A frame's file without the machine's part: ``torch/...`` for torch, relative to the repository otherwise."""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1]
    try:
        return Path(path).resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return Path(path).name


def main_thread_frames(stacks: str) -> list[str]:
    """The main thread's frames in a ``faulthandler`` dump (the block that is not the dumping thread's), innermost
    first, each as ``file:line function`` with :func:`_short` paths (``torch/autograd/graph.py:1072 ...``)."""
    blocks = [b for b in stacks.split("\n\n") if "(most recent call first)" in b]
    main = [b for b in blocks if not b.lstrip().startswith("Current thread")]
    frames = [re.search(r'File "(.*)", line (\d+) in (.*)', line) for line in (main[-1].splitlines() if main else [])]
    return [f"{_short(m[1])}:{m[2]} {m[3]}" for m in frames if m]
