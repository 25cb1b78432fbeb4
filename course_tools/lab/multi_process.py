"""The machinery behind the experiments of ``11_multi_process``: launchers, timing choreography, bookkeeping.

Reference machinery, not taught: the notebook keeps visible every line a learner must understand (what each rank
computes, the sharding, ``set_epoch``, the per-rank seed, the rank-0 write, the barrier) and calls these helpers
for the rest, from :func:`run_ranks` (forked ranks in one gloo group, section 1 onwards) to :func:`kill_and_resume`
(torchrun, section 9). Every file goes under one temporary folder (:func:`fresh`); :func:`cleanup` removes it. Example::

    answers = run_ranks(hello)                      # [rank 0's return value, rank 1's]
    job = kill_and_resume(kill_after=12)             # a KilledJob: losses, sessions, states
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch._dynamo  # noqa: F401  DDP imports it the first time it wraps a model: imported once here, every forked rank inherits it
import torch.distributed as dist

from course_utils import interrupt
from course_utils.checkpoint import CheckpointManager
from course_utils.runfolder import RunFiles, read_status
from course_utils.sinks import read_metrics

__all__ = ["CTX", "fresh", "cleanup", "run_ranks", "SpawnOutcome", "spawn_outcome", "flat", "describe_shares",
           "unlucky_atomic_saves", "ReadBeforeWrite", "shares_match_one_process", "torchrun_command",
           "ResumedJob", "KilledJob", "PRO_SCRIPT", "kill_and_resume"]

CTX = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
"""The fork start method, or None where the platform has none (Windows)."""

_WORK: Path | None = None


def fresh(name: str) -> Path:
    """A new, empty folder under this notebook's temporary folder: a cell run twice never finds its first run's files."""
    global _WORK
    if _WORK is None or not _WORK.is_dir():
        _WORK = Path(tempfile.mkdtemp(prefix="nb11_"))
    return Path(tempfile.mkdtemp(prefix=f"{name}_", dir=_WORK))


def cleanup() -> None:
    """Remove every file the experiments wrote."""
    global _WORK
    if _WORK is not None:
        shutil.rmtree(_WORK, ignore_errors=True)
    _WORK = None


# ---------------------------------------------------------------- launching ranks

def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, folder: Path, args: tuple) -> None:
    # In the child process: output to a log file, one thread, join the group, run fn, hand its result back.
    log = open(folder / f"rank{rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'rendezvous'}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    result = fn(rank, world_size, *args)
    torch.save(result, folder / f"result{rank}.pt")
    dist.barrier()  # no rank leaves while another one may still talk to it
    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 120) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` forked processes; return their results by rank.

    Each process uses one thread, joins a gloo group through a rendezvous file (no free port needed) and writes
    its output to a log file. A failed rank ends the others and raises a RuntimeError with the last lines of its
    log; so does a job still running after ``timeout``."""
    if CTX is None:
        raise RuntimeError("这个平台没有 fork:notebook 里定义的函数无法在子进程里运行。请在 Linux 或 WSL 里运行本 notebook")
    folder = fresh("launch")
    procs = [CTX.Process(target=_rank_main, args=(fn, rank, world_size, folder, args)) for rank in range(world_size)]
    try:
        for p in procs:
            p.start()
        deadline, running = time.monotonic() + timeout, list(procs)
        while running and not any(p.exitcode for p in procs) and time.monotonic() < deadline:
            ready = wait([p.sentinel for p in running], timeout=max(0.0, deadline - time.monotonic()))
            for p in running:
                if p.sentinel in ready:
                    p.join()  # it is exiting: reap it
            running = [p for p in running if p.exitcode is None]
    finally:  # a failed rank, a timeout or an interrupt: the others would wait in a collective, so stop them
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
            if p.pid is not None:
                p.join()
    if all(p.exitcode == 0 for p in procs):
        return [torch.load(folder / f"result{rank}.pt", weights_only=True) for rank in range(world_size)]
    failed = sorted((rank for rank, p in enumerate(procs) if p.exitcode is not None and p.exitcode > 0),
                    key=lambda rank: (folder / f"rank{rank}.log").stat().st_mtime_ns)  # the first to fail: the cause
    if not failed:
        raise RuntimeError(f"{timeout} s 内没有结束(某个 rank 卡在集合通信里?),已结束全部 {world_size} 个进程")
    raise RuntimeError(f"rank {failed[0]} 出错(退出码 {procs[failed[0]].exitcode}),其余 rank 已被结束。"
                       "它输出的最后几行:\n" + (folder / f"rank{failed[0]}.log").read_text()[-2000:])


@dataclass(frozen=True)
class SpawnOutcome:
    """How a ``spawn`` child ended: its exit code and the last line it wrote to stderr."""

    exitcode: int | None
    error: str


def spawn_outcome(fn: Callable[[], Any], timeout: float = 120) -> SpawnOutcome:
    """Run ``fn`` in a process started with ``spawn``; its stderr is caught in a file instead of the cell's output."""
    log = fresh("spawn") / "stderr.txt"
    saved = os.dup(2)
    with open(log, "wb") as err:
        sys.stderr.flush()
        os.dup2(err.fileno(), 2)  # the child inherits this file as its stderr
        try:
            child = mp.get_context("spawn").Process(target=fn)
            child.start()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
        child.join()
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return SpawnOutcome(child.exitcode, lines[-1] if lines else "")


# ---------------------------------------------------------------- bookkeeping of the experiments

def flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """All ``tensors`` (parameters, gradients) as one detached vector."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def describe_shares(samples_seen: Callable[..., list[list[int]]], how: str, n: int = 20
                    ) -> tuple[list[list[list[int]]], dict[str, Any]]:
    """Run ``samples_seen(rank, world_size, how, n)`` on two ranks, print one line about it, return
    ``(seen, row)``: ``seen[rank][epoch]`` the samples drawn; ``row`` the overlap of the two ranks in
    epoch 0, the distinct samples and the draws of epoch 0, and whether rank 0's two epochs share one order."""
    seen = run_ranks(samples_seen, how, n)
    epoch0 = [*seen[0][0], *seen[1][0]]
    row = {"overlap": len(set(seen[0][0]) & set(seen[1][0])), "covered": len(set(epoch0)), "draws": len(epoch0),
           "same_order": list(seen[0][0]) == list(seen[0][1])}
    print(f"{how}(n={n}): 两个 rank 重叠 {row['overlap']} 个,一个 epoch 里不同的样本 {row['covered']}/{n},"
          f"抽样 {row['draws']} 次,第 2 个 epoch 的顺序与第 1 个相同: {row['same_order']}")
    return seen, row


def shares_match_one_process(samples: Sequence[dict[int, list[int]]], dataset: Any, global_batch: int,
                             seed: int) -> bool:
    """True when, at every step, rank 0's share + rank 1's share is one process's global batch,
    and every epoch covers every sample exactly once (``samples[rank][step]``: the ids a rank trained on)."""
    from course_utils.data import batches_per_epoch, make_loader

    per_epoch = batches_per_epoch(len(dataset), global_batch)
    epochs: dict[int, list[int]] = {}
    for step, ours in samples[0].items():
        epoch, position = divmod(step - 1, per_epoch)
        single = next(iter(make_loader(dataset, global_batch, seed=seed, epoch=epoch, start_batch=position)))
        if ours + samples[1][step] != single[-1].tolist():
            return False
        epochs.setdefault(epoch, []).extend(ours + samples[1][step])
    return all(sorted(ids) == list(range(len(dataset))) for ids in epochs.values())


# ---------------------------------------------------------------- timing choreography

def unlucky_atomic_saves(rank: int, world_size: int, path: Path) -> dict[str, Any]:
    """Two ranks save through ONE fixed temp name (section 5); barriers force the unlucky order every time.

    Rank 0 writes its temp file; rank 1 opens the same temp file for writing (emptying it); rank 0 renames it
    (the checkpoint is now 0 bytes); rank 1 writes into the renamed file and its own rename fails. Returns what
    each rank saw."""
    tmp = path.with_name(f".{path.name}.tmp")  # a fixed temp name: the same for every process
    state = {"step": 10, "written_by": rank, "rng": torch.get_rng_state()}
    size_after_rank0, error = None, None
    if rank == 0:
        f = open(tmp, "wb")
        torch.save(state, f)
        f.flush()
        dist.barrier()  # 1: rank 0 has written its temp file ...
        dist.barrier()  # 2: ... and rank 1 has opened the same temp file for writing (which empties it)
        f.close()
        os.replace(tmp, path)  # rank 0's "atomic" save completes
        size_after_rank0 = path.stat().st_size
        dist.barrier()  # 3
        dist.barrier()  # 4: rank 1 is done
    else:
        dist.barrier()  # 1
        f = open(tmp, "wb")
        dist.barrier()  # 2
        dist.barrier()  # 3: rank 0 has renamed the temp file
        torch.save(state, f)
        f.close()
        try:
            os.replace(tmp, path)
        except OSError as exc:
            error = type(exc).__name__
        dist.barrier()  # 4
    return {"size_after_rank0": size_after_rank0, "error": error,
            "written_by": torch.load(path, weights_only=True)["written_by"]}


class ReadBeforeWrite:
    """The unlucky timing of a missing barrier (section 7), made certain: rank 0 writes only after rank 1 has read.

    ``writer_waits(folder)`` (rank 0, before writing) returns once ``reader_done(folder)`` (rank 1, after reading)
    has been called; a marker file carries the signal between the processes."""

    MARKER = "rank1_has_read"

    @classmethod
    def writer_waits(cls, folder: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not (folder / cls.MARKER).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{folder / cls.MARKER} 没有出现")
            time.sleep(0.005)

    @classmethod
    def reader_done(cls, folder: Path) -> None:
        (folder / cls.MARKER).touch()


# ---------------------------------------------------------------- torchrun: kill a whole job, resume it

def torchrun_command(script: Path, out: Path, *extra: str, fraction: float = 0.1) -> list[str]:
    """``python -m torch.distributed.run`` (the torchrun command, of this Python) with 2 CPU ranks on ``script``.

    ``--batch-size 32`` is the GLOBAL batch: 16 samples per rank and step; a checkpoint every 5 steps."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
            "--out", str(out), "--model", "tiny", "--width", "8", "--data-fraction", str(fraction),
            "--batch-size", "32", "--epochs", "2", "--warmup-steps", "5", "--lr", "3e-3", "--ckpt-every-steps", "5",
            "--log-every", "1", "--no-progress", "--workers", "0", "--device", "cpu", *extra]


def _train_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(RunFiles(out).metrics) if r["split"] == "train"}


def _job_processes(agent: subprocess.Popen) -> dict[int, Any]:
    """pid -> psutil.Process of the torchrun agent and everything under it (empty once the agent is gone)."""
    import psutil

    try:
        root = psutil.Process(agent.pid)
        return {p.pid: p for p in [root, *root.children(recursive=True)]}
    except psutil.NoSuchProcess:
        return {}


def _statuses(processes: dict[int, Any]) -> dict[int, str]:
    """pid -> psutil's status ("running", "stopped", "zombie", ...) of each of ``processes`` that still exists."""
    import psutil

    found = {}
    for pid, p in processes.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            found[pid] = p.status()
    return found


def _alive(processes: dict[int, Any]) -> list[int]:
    """The pids of ``processes`` that still run (neither gone nor a zombie)."""
    return [pid for pid, status in _statuses(processes).items() if status != "zombie"]


def _kill_job(proc: subprocess.Popen) -> tuple[dict[int, int], list[int]]:
    """SIGKILL every process of the job at once, as a power cut would: freeze them all first, so that none
    reacts to another's death. Returns ``{pid: session id}`` of the job's processes and those still alive after."""
    import psutil

    agent, frozen = psutil.Process(proc.pid), {}
    while new := [p for p in [agent, *agent.children(recursive=True)] if p.pid not in frozen]:
        for p in new:
            p.suspend()
            frozen[p.pid] = p
    sessions = {pid: os.getsid(pid) for pid in frozen}
    for p in frozen.values():
        p.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while (survivors := _alive(frozen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sessions, survivors


@contextlib.contextmanager
def _side_by_side(script: Path, ref_dir: Path, out: Path, command: list[str], fraction: float,
                  env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    """Start the uninterrupted reference run in ``ref_dir`` and the job ``command`` writing to ``out`` (2 ranks each,
    output in a ``log.txt`` beside each run folder); on the way out, a failure or an interrupt included, every
    process of either job that still runs (a stopped rank too) is killed."""
    if not script.is_file():
        raise FileNotFoundError(f"本节要运行 {script}:请在仓库里打开本 notebook(JupyterLab 以仓库根目录启动)")
    with open(ref_dir.parent / "log.txt", "w") as ref_log, open(out.parent / "log.txt", "w") as job_log:
        ref_job = subprocess.Popen(torchrun_command(script, ref_dir, fraction=fraction), stdout=ref_log,
                                   stderr=subprocess.STDOUT, env=env)
        job = subprocess.Popen(command, stdout=job_log, stderr=subprocess.STDOUT, env=env)
        try:
            yield ref_job, job
        finally:
            for proc in (job, ref_job):
                if proc.poll() is None:
                    _kill_job(proc)


def _resume(command: list[str], out: Path, ref_job: subprocess.Popen, ref_dir: Path, env: dict[str, str],
            timeout: float, start: float) -> dict[str, Any]:
    """Run ``command --resume`` (writing to ``out``), wait for the reference run: the fields of :class:`ResumedJob`."""
    resume = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=timeout)
    ref_job.wait(timeout=timeout)
    return {"reference": _train_losses(ref_dir), "resumed": _train_losses(out),
            "returncodes": {"reference": ref_job.returncode, "resume": resume.returncode},
            "states": [read_status(d, check_alive=False)["state"] for d in (ref_dir, out)],
            "seconds": time.perf_counter() - start, "resume_log": (resume.stdout + resume.stderr)[-300:]}


@dataclass(frozen=True)
class ResumedJob:
    """What sections 9 and 10 both end with: the uninterrupted run, and the interrupted one after --resume."""

    reference: dict[int, float]        # step -> train loss of the uninterrupted run
    resumed: dict[int, float]          # step -> train loss of the interrupted run after --resume
    returncodes: dict[str, int | None]  # reference, resume
    states: list[str]                  # status.json's state at the end: reference, resumed
    seconds: float
    resume_log: str


@dataclass(frozen=True)
class KilledJob(ResumedJob):
    """What :func:`kill_and_resume` measured."""

    command: list[str]                 # the interrupted job's torchrun command (the resume adds --resume)
    agent_pid: int
    sessions: dict[int, int]           # pid -> session id of every process of the killed job
    survivors: list[int]               # processes of the killed job still alive after the kill
    killed_returncode: int | None
    status_after_kill: str             # status.json's state, as the killed job left it
    latest: dict[str, Any]             # the newest valid checkpoint: step, world_size, rng_ranks (count)
    before_kill: dict[int, float]      # step -> train loss logged before the kill


PRO_SCRIPT = Path(__file__).resolve().parents[2] / "solutions" / "homework" / "train_cifar_pro.py"
"""The professional script that section 9 runs under torchrun."""


def kill_and_resume(script: Path = PRO_SCRIPT, kill_after: int = 12, fraction: float = 0.1,
                    timeout: float = 300) -> KilledJob:
    """Start a reference run and a run to interrupt side by side (2 jobs x 2 ranks, one thread each); SIGKILL the
    whole second job right after optimizer step ``kill_after`` (each rank freezes itself there through
    ``course_utils.interrupt --stop``, then every process of the job is killed at once); resume it with ``--resume``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref_dir, cut_dir = fresh("pro_reference") / "run", fresh("pro_interrupted") / "run"  # --out: a folder to create
    command = torchrun_command(script, cut_dir, fraction=fraction)
    # each rank freezes itself (SIGSTOP) right after its kill_after-th optimizer step: the job is killed there
    at = command.index(str(script))
    stopping = [*command[:at], interrupt.__file__, "--stop", str(kill_after), *command[at:]]
    start = time.perf_counter()
    with _side_by_side(script, ref_dir, cut_dir, stopping, fraction, env) as (ref_job, cut_job):
        deadline, killed = time.monotonic() + timeout, None
        while cut_job.poll() is None and time.monotonic() < deadline:
            if list(_statuses(_job_processes(cut_job)).values()).count("stopped") == 2:  # both ranks, by SIGSTOP
                killed = _kill_job(cut_job)
                break
            time.sleep(0.05)
        if killed is None:  # it ended (or hung) before the moment to kill it
            if cut_job.poll() is None:
                _kill_job(cut_job)
            raise RuntimeError(f"被中断的运行没有跑到第 {kill_after} 步(退出码 {cut_job.returncode}),它输出的最后几行:\n"
                               + (cut_dir.parent / "log.txt").read_text()[-1500:])
        before_kill = _train_losses(cut_dir)
        status_after_kill = read_status(cut_dir, check_alive=False)["state"]
        found = CheckpointManager(RunFiles(cut_dir).checkpoints).load_latest()
        latest = {"name": found.path.name, "step": found.state["step"], "world_size": found.state["world_size"],
                  "rng_ranks": len(found.state["rng_ranks"])}
        resumed = _resume(command, cut_dir, ref_job, ref_dir, env, timeout, start)
    return KilledJob(command=command, agent_pid=cut_job.pid, sessions=killed[0], survivors=killed[1],
                     killed_returncode=cut_job.returncode, status_after_kill=status_after_kill, latest=latest,
                     before_kill=before_kill, **resumed)
