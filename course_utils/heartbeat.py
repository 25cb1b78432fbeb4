"""Heartbeats and a hang watchdog: the failure that prints nothing, detected, named and ended.

What: ``Heartbeat.enter(phase, step)`` records which phase of which step this rank is in, in a small
memory-mapped file, ``heartbeats/rank_<r>.hb`` in the run folder (one ``struct.pack_into``: no system
call on the training path). A ``Watchdog`` thread in every rank stamps that file about once a second
(alive) and reads every rank's (``read_heartbeats``). When no
rank has made progress for ``limit()`` seconds, every live rank dumps the stacks of all its threads
(``faulthandler``) into ``hangs/<time>-step<N>/``, the lowest live rank writes ``report.json`` there and
calls ``on_hang`` (the script writes status.json "hung"), frozen ranks on this machine and every rank's
DataLoader workers are killed, and each process ends with ``ExitCode.HUNG`` (124, as ``timeout(1)``).
The folders are ``RunFiles.heartbeats`` and ``RunFiles.hangs``.
``Stragglers`` reads each rank's time per step, a different problem: slow, not stuck.

Why: a rank that stops (a stuck NFS read, a deadlocked DataLoader worker, SIGSTOP, a driver fault) makes
every other rank wait in the next collective: gloo waits 30 minutes by default, nothing prints, the job's
bill keeps running. The waiting ranks only know that they wait; the heartbeats say who is stuck and where.

Pitfalls handled:
- The channel is files, not the process group: the collective that hangs cannot carry the alarm.
- A frozen rank cannot report itself: its watchdog is frozen too, so its file stops being stamped.
  That is how the others name it (``frozen``); a rank that is alive but blocked (a stuck read) keeps
  refreshing its file and is named as the one that is furthest behind (step, then ``PHASES`` order).
- Waiting is not progress: a rank waiting in a collective stays in the phase it entered.
- The phase must be published as it changes, not at the next stamp: a 15 ms step would be 60 steps
  ahead of a file written once a second. Memory-mapped, the write is a copy into the page cache, which
  every process on the machine reads at once (across machines on a shared folder, it is visible only
  after the kernel writes the page back: not flushed here, and untested).
- Start-up and the first step are slow (workers start, the first checkpoint): the limit is at least
  ``FIRST_STEP_GRACE_S`` until this process has finished a step.
- The times are wall-clock (``time.time``), compared across processes and machines: a clock stepped
  by more than the limit would look like a hang (NTP normally slews the clock, it does not step it).
- ``--hang-timeout`` must cover the slowest thing one rank does between two heartbeats: a checkpoint save
  (one beat) or an evaluation batch (one beat per batch).

Example::

    beat = Heartbeat(rank)
    with Watchdog(beat, run_folder, world_size, timeout=None, on_hang=write_hung_status):
        for step in ...:
            beat.enter("data", step); x, y = next(batches)
            ...                                  # forward/backward/allreduce/optimizer: Heartbeat.attach's hooks

Reference machinery of ``solutions/homework/train_cifar_pro.py``; taught in 11 §10 (a rank frozen live).
"""
from __future__ import annotations

import faulthandler
import json
import mmap
import os
import signal
import socket
import statistics
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from course_utils.runfolder import ExitCode, RunFiles

__all__ = ["PHASES", "FIRST_STEP_GRACE_S", "Heartbeat", "Watchdog", "HangReport", "Stragglers", "read_heartbeats"]

PHASES = ("start", "data", "forward", "backward", "allreduce", "optimizer", "eval", "save")
"""A step's phases in order: a rank in an earlier phase of the same step is behind (eval and save end a step)."""

FIRST_STEP_GRACE_S = 120.0
AUTO_MIN_S, AUTO_STEPS, AUTO_MAX_S = 60.0, 20, 1500.0  # auto limit: 20 × the median step, within [60 s, 25 min]
# a heartbeat file: this struct (a sequence number at both ends: a torn read is retried), then the rank's
# identity as JSON padded with spaces to FILE_SIZE bytes
_LIVE = struct.Struct("<qqqddq")  # seq, step, phase index, since (time.time() of the phase's start), stamped, seq
FILE_SIZE = 512


class Heartbeat:
    """This rank's progress: the phase of the step it is in, since when, and the seconds spent per phase.

    ``on_enter(step, phase)``, when set, is called at every phase change (the script's test probes use it).
    """

    def __init__(self, rank: int = 0) -> None:
        self.rank, self.step, self.phase, self.since = rank, 0, "start", time.time()
        self._mark = self.since  # what ``spent`` has counted up to
        self.steps_done = 0  # steps this process finished (a "data" entry after the first)
        self.step_starts: deque[float] = deque(maxlen=101)
        self.spent: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.counted = 0  # steps started since the last ``take_times``
        self.exchanges = 0  # gradient buckets all-reduced since then (DDP's comm hook)
        self.on_enter: Callable[[int, str], None] | None = None
        self._map: mmap.mmap | None = None  # ``publish``
        self._seq, self._lock = 0, threading.Lock()

    def publish(self, path: Path, identity: dict[str, Any]) -> None:
        """From now on every change is written to ``path`` (created, ``FILE_SIZE`` bytes, memory-mapped)."""
        data = json.dumps(identity).encode().ljust(FILE_SIZE - _LIVE.size)
        path.write_bytes(bytes(_LIVE.size) + data)
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), FILE_SIZE)
        self.stamp()

    def stamp(self) -> None:
        """Write the current step and phase with the time now (the watchdog calls it: this rank is alive)."""
        if self._map is not None:
            with self._lock:
                self._seq += 1
                _LIVE.pack_into(self._map, 0, self._seq, self.step, PHASES.index(self.phase), self.since,
                                time.time(), self._seq)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def enter(self, phase: str, step: int | None = None) -> None:
        now = self._account()
        if phase == "data":
            self.steps_done += bool(self.step_starts)
            self.step_starts.append(now)
            self.counted += 1
        self.step, self.phase, self.since = self.step if step is None else step, phase, now
        self.stamp()
        if self.on_enter is not None:
            self.on_enter(self.step, phase)

    def _account(self) -> float:
        """Charge the time since the last change to the current phase; now."""
        now = time.time()
        self.spent[self.phase] += now - self._mark
        self._mark = now
        return now

    def each(self, items: Iterable, phase: str) -> Iterator:
        """``items``, entering ``phase`` before each one is fetched: a long evaluation is progress."""
        self.enter(phase)
        for item in items:
            yield item
            self.enter(phase)

    def median_step_s(self) -> float | None:
        starts = list(self.step_starts)
        return statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(starts) > 2 else None

    def take_times(self) -> dict[str, float]:
        """Seconds per step since the last call: ``busy`` (data, forward, backward, optimizer), ``data`` and
        ``wait`` (the gradient all-reduce: waiting for the slowest rank); ``exchanges``: gradient buckets
        all-reduced per step (DDP; with gradient accumulation the same number as without it); ``steps``. Then start over."""
        self._account()  # the phase in progress, up to now (no progress: ``since`` stays)
        n = max(self.counted, 1)
        times = {"steps": self.counted, "data": self.spent["data"] / n, "wait": self.spent["allreduce"] / n,
                 "busy": sum(self.spent[p] for p in ("data", "forward", "backward", "optimizer")) / n,
                 "exchanges": self.exchanges / n}
        self.spent, self.counted, self.exchanges = dict.fromkeys(PHASES, 0.0), 0, 0
        return times

    def attach(self, model: Any, optimizer: Any, ddp: Any = None) -> list[Any]:
        """Hooks that enter forward (before ``model`` runs in training mode), backward (after it), allreduce
        (the first gradient bucket under DDP: a comm hook doing DDP's own average) and optimizer (its step).
        The handles (``remove()``) are returned; DDP's hook cannot be removed."""
        def forward(module, args):
            if module.training:
                self.enter("forward")

        def backward(module, args, output):
            if module.training:
                self.enter("backward")

        handles = [model.register_forward_pre_hook(forward), model.register_forward_hook(backward),
                   optimizer.register_step_pre_hook(lambda *_: self.enter("optimizer"))]
        if ddp is not None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def allreduce(state, bucket):
                self.exchanges += 1
                if self.phase != "allreduce":
                    self.enter("allreduce")
                return allreduce_hook(state, bucket)
            ddp.register_comm_hook(None, allreduce)
        return handles


@dataclass
class HangReport:
    """What the watchdog found: the stuck ranks (rank, phase, step, seconds since their last heartbeat,
    frozen: their watchdog stopped too), the limit it used, the folder of the stacks, a one-line message."""

    limit_s: float
    stuck: list[dict[str, Any]]
    folder: str
    reporter: int
    message: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)


class Watchdog:
    """A daemon thread: writes this rank's heartbeat file, and ends the job when no rank has made progress
    for ``limit()`` seconds (see the module docstring). ``timeout`` None: the automatic limit; 0: off.

    Pitfall: it ends the process with ``os._exit``: nothing after the last checkpoint is kept (the same as
    ``kill -9``; ``--resume`` continues exactly from that checkpoint).
    """

    def __init__(self, beat: Heartbeat, folder: str | os.PathLike | RunFiles, world_size: int, *,
                 timeout: float | None, on_hang: Callable[[HangReport], None] | None = None) -> None:
        files = RunFiles.of(folder)
        self.beat, self.size, self.timeout, self.on_hang = beat, world_size, timeout, on_hang
        self.dir, self.hangs = files.heartbeats, files.hangs
        self.mine = self.dir / f"rank_{beat.rank}.hb"
        self.job = os.environ.get("TORCHELASTIC_RUN_ID", ""), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def limit(self) -> float:
        """Seconds without progress that make a hang: ``timeout``, or 20 × the median step within [60 s, 25 min];
        at least ``FIRST_STEP_GRACE_S`` until this process has finished a step."""
        median = self.beat.median_step_s()
        limit = self.timeout or min(max(AUTO_MIN_S, AUTO_STEPS * (median or 0.0)), AUTO_MAX_S)
        return limit if self.beat.steps_done else max(limit, FIRST_STEP_GRACE_S)

    def poll_s(self) -> float:
        return min(1.0, max(0.1, self.limit() / 20))

    def __enter__(self) -> "Watchdog":
        if self.timeout != 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.beat.publish(self.mine, {"rank": self.beat.rank, "pid": os.getpid(), "host": socket.gethostname(),
                                          "job": list(self.job)})
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        """A normal way out: the thread stops, this rank's file goes (a heartbeat file left = not ended cleanly)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.beat.close()
        for path in (self.mine, self.dir):
            try:
                path.unlink() if path == self.mine else path.rmdir()  # the folder goes with the last rank
            except OSError:
                pass

    def read(self) -> dict[int, dict[str, Any]]:
        """Every rank's heartbeat of this job attempt (rank -> record); a rank without one is missing."""
        beats = read_heartbeats(self.dir)
        return {r: b for r, b in beats.items() if r < self.size and tuple(b["job"]) == self.job}

    def check(self, now: float | None = None) -> HangReport | None:
        """A report when no rank has made progress for ``limit()`` seconds, else None."""
        now, limit = time.time() if now is None else now, self.limit()
        beats = self.read()
        beats[self.beat.rank] = {"rank": self.beat.rank, "step": self.beat.step, "phase": self.beat.phase,
                                 "since": self.beat.since, "stamped": now, "pid": os.getpid(),
                                 "host": socket.gethostname()}
        if now - max(b["since"] for b in beats.values()) < limit:
            return None
        stale = max(2.0, 4 * self.poll_s())
        ranks = [{"rank": r, "phase": b["phase"], "step": b["step"], "seconds": round(now - b["since"], 1),
                  "frozen": now - b["stamped"] > stale, "pid": b["pid"], "host": b["host"]}
                 for r, b in sorted(beats.items())]
        missing = [{"rank": r, "phase": None, "step": None, "seconds": None, "frozen": True, "pid": None,
                    "host": None} for r in range(self.size) if r not in beats]
        frozen = [r for r in ranks if r["frozen"]] + missing
        if frozen:
            stuck = frozen
        else:
            behind = min((r["step"], PHASES.index(r["phase"])) for r in ranks)
            stuck = [r for r in ranks if (r["step"], PHASES.index(r["phase"])) == behind]
        reporter = min(r["rank"] for r in ranks if not r["frozen"])
        newest = max(b["since"] for b in beats.values())
        name = time.strftime("%Y%m%d-%H%M%S", time.localtime(newest)) + f"-step{max(r['step'] for r in ranks)}"
        report = HangReport(limit, stuck, str(self.hangs / name), reporter, ranks=ranks + missing)
        who = ";".join(f"rank {r['rank']}" + (" 没有心跳" if r["phase"] is None else
                       f" 在 step {r['step']} 的 {r['phase']} 阶段已 {r['seconds']:.0f} 秒没有前进")
                       + (",进程已冻结" if r["frozen"] else "") for r in stuck)
        report.message = (f"卡住(hang): {limit:.0f} 秒内没有任何进程前进。{who}。各进程的线程栈在 {name}/;"
                          "检查该进程(数据读取、DataLoader worker、设备)后用 --resume 从最后一个检查点继续")
        return report

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s()):
            try:
                self.beat.stamp()
                report = self.check()
            except OSError:  # a full disk or a folder gone: try again at the next poll
                continue
            if report is not None and not self._stop.is_set():
                self.end(report)

    def end(self, report: HangReport) -> None:
        """Dump this process's stacks, report (the lowest live rank), kill what cannot leave by itself, exit."""
        folder = Path(report.folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"stacks_rank{self.beat.rank}.txt", "w") as f:
            f.write(f"rank {self.beat.rank} pid {os.getpid()}: step {self.beat.step}, phase {self.beat.phase}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        if report.reporter == self.beat.rank:
            (folder / "report.json").write_text(json.dumps(asdict(report), indent=2, ensure_ascii=False) + "\n")
            if self.on_hang is not None:
                self.on_hang(report)
            print(report.message, file=sys.stderr)
            host = socket.gethostname()
            for r in report.stuck:
                if r["frozen"] and r["pid"] and r["host"] == host and _same_job(r["pid"], self.job):
                    _kill_tree(r["pid"])
            live = [r["rank"] for r in report.ranks if not r["frozen"] and r["rank"] != self.beat.rank]
            deadline = time.monotonic() + 5  # the others' stacks before this process goes (torchrun then stops them)
            while time.monotonic() < deadline and not all((folder / f"stacks_rank{r}.txt").exists() for r in live):
                time.sleep(0.05)
        for child in _children(os.getpid()):  # DataLoader workers: a stopped one would never leave
            _kill(child)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.HUNG)


class Stragglers:
    """Alerts when one rank is persistently slower than the others: alive, so not a hang, but everyone waits.

    ``update(times)`` takes every rank's ``Heartbeat.take_times()`` (rank r's at index r) and returns the
    ranks whose median ``busy`` time per step over the last ``window`` steps is over ``ratio`` × the median of
    the other ranks' (and at least ``min_gap_s`` more), each once until it recovers.

    Pitfall: a mean lets a few slow steps that hit every rank (a new epoch's DataLoader workers starting, a
    checkpoint, a busy machine) hide a straggler: a rank 50 ms slower in every step then averaged 1.4x, not
    1.5x. The median over the window looks past them.
    """

    def __init__(self, window: int = 20, ratio: float = 1.5, min_gap_s: float = 0.005) -> None:
        self.window, self.ratio, self.min_gap_s = window, ratio, min_gap_s
        self.history: deque[list[dict[str, float]]] = deque()
        self.flagged: set[int] = set()

    def update(self, times: list[dict[str, float]]) -> list[tuple[int, float, float]]:
        """New stragglers as (rank, its median busy s/step, the others' median)."""
        self.history.append(times)
        while sum(t[0]["steps"] for t in self.history) - self.history[0][0]["steps"] >= self.window:
            self.history.popleft()
        steps = sum(t[0]["steps"] for t in self.history)
        if len(times) < 2 or steps < self.window:
            return []
        typical = [_median_per_step([(t[r]["busy"], t[r]["steps"]) for t in self.history]) for r in range(len(times))]
        new = []
        for r, busy in enumerate(typical):
            others = statistics.median(m for q, m in enumerate(typical) if q != r)
            slow = busy > self.ratio * others and busy - others > self.min_gap_s
            if slow and r not in self.flagged:
                new.append((r, busy, others))
            (self.flagged.add if slow else self.flagged.discard)(r)
        return new


def _median_per_step(values: list[tuple[float, int]]) -> float:
    """The median step's value, each (mean over an interval, its number of steps) counted once per step."""
    ordered, half, seen = sorted(values), sum(n for _, n in values) / 2, 0
    for value, n in ordered:
        seen += n
        if seen >= half:
            return value
    return ordered[-1][0]


def read_heartbeats(folder: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """The heartbeat files in ``folder`` (``RunFiles.heartbeats``): rank -> {rank, pid, host, job, step, phase,
    since, stamped}; what the watchdog reads, and what to look at while a job seems stuck."""
    found = {}
    for path in sorted(Path(folder).glob("rank_*.hb")):
        for _ in range(3):  # a read torn by a write in progress: the sequence numbers differ
            try:
                data = path.read_bytes()
                seq, step, phase, since, stamped, end = _LIVE.unpack_from(data)
                identity = json.loads(data[_LIVE.size:FILE_SIZE].decode())
            except (OSError, ValueError, struct.error):
                break
            if seq == end and seq > 0:
                found[identity["rank"]] = {**identity, "step": step, "phase": PHASES[phase], "since": since,
                                           "stamped": stamped}
                break
    return found


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_tree(pid: int) -> None:
    for child in _children(pid):
        _kill(child)
    _kill(pid)


def _same_job(pid: int, job: tuple[str, str]) -> bool:
    """``pid`` is a rank of this job (its torchrun run id), not a process that reused the number."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"TORCHELASTIC_RUN_ID={job[0]}".encode() in environ and bool(job[0])
