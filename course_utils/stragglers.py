"""Stragglers: one rank persistently slower than the others. Alive, so not a hang, but everyone waits for it.

What: ``Stragglers.update(times)`` takes every rank's ``Heartbeat.take_times()`` (``course_utils.heartbeat``)
and names the ranks whose median busy time per step is well over the others'; ``alert_text`` says so in one
line for the run's alerts.

Why: under DDP every rank waits for the slowest in each gradient all-reduce, so one slow rank (a busy
machine, a throttled GPU, a slow disk) slows the whole job down, and nothing fails.

Example::

    stragglers = Stragglers(window=20)
    for rank, busy, others in stragglers.update(gather(beat.take_times())):
        monitor.alert("straggler", stragglers.alert_text(rank, busy, others), step)

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (through ``course_utils.hang_guard``).
"""
from __future__ import annotations

import statistics
from collections import deque

__all__ = ["Stragglers"]


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

    def alert_text(self, rank: int, busy: float, others: float) -> str:
        """The alert for a straggler ``update`` named (busy and others in seconds per step)."""
        return (f"rank {rank} 持续偏慢: 最近 {self.window} 步每步忙的中位数 {busy * 1e3:.0f} ms,"
                f"其他 rank 的中位数 {others * 1e3:.0f} ms;它没有卡住,其他 rank 在梯度同步时等它")


def _median_per_step(values: list[tuple[float, int]]) -> float:
    """The median step's value, each (mean over an interval, its number of steps) counted once per step."""
    ordered, half, seen = sorted(values), sum(n for _, n in values) / 2, 0
    for value, n in ordered:
        seen += n
        if seen >= half:
            return value
    return ordered[-1][0]
