"""Heartbeats: which phase of which step each rank is in, published as it changes, readable by every rank.

What: ``Heartbeat.enter(phase, step)`` records which phase of which step this rank is in, in a small
memory-mapped file, ``heartbeats/rank_<r>.hb`` in the run folder (``RunFiles.heartbeats``; one
``struct.pack_into``: no system call on the training path). ``read_heartbeats`` reads every rank's file:
what ``course_utils.watchdog`` compares to find a hang, and what to look at while a job seems stuck.
``Heartbeat.take_times`` adds up the seconds per phase: what ``course_utils.stragglers`` compares.

Why: a rank that stops (a stuck NFS read, a deadlocked DataLoader worker, SIGSTOP, a driver fault) makes
every other rank wait in the next collective; the waiting ranks only know that they wait. The heartbeats
say who is where.

Pitfalls handled:
- The channel is files, not the process group: the collective that hangs cannot carry the alarm.
- Waiting is not progress: a rank waiting in a collective stays in the phase it entered.
- The phase must be published as it changes, not at the next stamp: a 15 ms step would be 60 steps
  ahead of a file written once a second. Memory-mapped, the write is a copy into the page cache, which
  every process on the machine reads at once (across machines on a shared folder, it is visible only
  after the kernel writes the page back: not flushed here, and untested).
- A torn read (a write in progress) is detected by a sequence number at both ends of the record, and retried.
- The times are wall-clock (``time.time``), compared across processes and machines: a clock stepped
  by more than the watchdog's limit would look like a hang (NTP normally slews the clock, it does not step it).

Example::

    beat = Heartbeat(rank)
    beat.publish(files.heartbeats / f"rank_{rank}.hb", {"rank": rank, "pid": os.getpid(), "host": host, "job": job})
    beat.attach(model, optimizer)                # forward/backward/optimizer: hooks enter those phases
    for step in ...:
        beat.enter("data", step); x, y = next(batches)
    read_heartbeats(files.heartbeats)            # {0: {"step": 12, "phase": "forward", "since": ..., ...}, 1: ...}

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (through ``course_utils.hang_guard``);
11 §10 freezes a rank of it and reads these files (``course_tools/lab/hangs.py``).
"""
from __future__ import annotations

import json
import mmap
import os
import statistics
import struct
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

__all__ = ["PHASES", "FILE_SIZE", "Heartbeat", "read_heartbeats"]

PHASES = ("start", "data", "forward", "backward", "allreduce", "optimizer", "eval", "save")
"""A step's phases in order: a rank in an earlier phase of the same step is behind (eval and save end a step)."""

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
