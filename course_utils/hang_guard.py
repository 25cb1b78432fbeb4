"""``--hang-timeout`` as one part of a run: heartbeats, the watchdog, the stragglers and status.json "hung".

What: ``HangGuard`` puts together what a training script needs against a job that stops without a word:
this rank's ``Heartbeat`` (``course_utils.heartbeat``) with hooks on the model and the optimizer, a
``Watchdog`` (``course_utils.watchdog``) while the guard is entered (``with``), which on a hang makes rank 0
write status.json "hung" through ``RunFolder.ended``, and every ``every`` steps each rank's time per step in
metrics.jsonl with a ``Stragglers`` alert (``course_utils.stragglers``). A script meets it in four places:
where the loop starts (``with HangGuard(...)``), around each step (``with guard.step(...)``), where it saves
(``enter("save")``) and where it evaluates (``each(batches, "eval")``): the phases a stuck rank is named by.

Why a component: spread over a script, the same feature took ten places (fields, the loop, the save, the
evaluation, status writers, an alert text); here it is one object the loop calls.

Pitfalls handled:
- the times are gathered at the same steps on every rank (``step % every``): a collective that one rank
  skipped would hang the job it watches;
- the status of a hang is written by rank 0's watchdog thread while the main thread is stuck: ``status``
  is a function that reads the run's progress then, not a value taken at the start;
- ``status`` usually reads the run's own state, which holds this guard: the guard lets go of it on leaving
  the ``with``, so that the two form no reference cycle (one would keep the run's DataLoader workers alive
  after it ends, until the garbage collector runs: an interpreter exit then hangs).

Example::

    with HangGuard(world, files, run, ddp_model, optimizer, timeout=None, every=20,
                   status=lambda: {"step": step}) as guard:
        for step in range(1, total + 1):
            with guard.step(step, monitor):         # phase "data"; at the end, every 20 steps: every rank's times
                ...                                 # forward, backward, allreduce, optimizer: hooks

Reference machinery of ``solutions/homework/train_cifar_pro.py``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

from course_utils.distributed import World, gather
from course_utils.heartbeat import Heartbeat
from course_utils.runfolder import ExitCode, RunFiles, RunFolder
from course_utils.stragglers import Stragglers
from course_utils.watchdog import AUTO_MAX_S, HangReport, Watchdog

__all__ = ["HangGuard", "collective_timeout_s"]


def collective_timeout_s(hang_timeout: float | None) -> float | None:
    """How long a collective may wait (``course_utils.distributed.setup``): the watchdog's largest limit + 5 min,
    so that the watchdog (``hang_timeout`` s, or at most ``AUTO_MAX_S``) fires first; with the watchdog off
    (0), None: torch's defaults (gloo 30 min, NCCL 10 min)."""
    return (hang_timeout or AUTO_MAX_S) + 300 if hang_timeout != 0 else None


class HangGuard:
    """One rank's heartbeat, watchdog and straggler watch (see the module docstring); a context manager.

    ``run``: rank 0's claimed folder (the status of a hang goes there), None on the other ranks; ``model``:
    what trains (DDP's wrapper under torchrun: its all-reduce is a phase too); ``timeout``: ``--hang-timeout``
    (None: automatic, 0: no watchdog); ``every``: steps between two gatherings of the ranks' times;
    ``status()``: status.json's fields at the moment of a hang (step, ...); ``on_enter(step, phase)``: called
    at every phase change (the script's test probes).
    """

    def __init__(self, world: World, files: RunFiles, run: RunFolder | None, model: Any, optimizer: Any, *,
                 timeout: float | None, every: int, status: Callable[[], dict[str, Any]],
                 on_enter: Callable[[int, str], None] | None = None) -> None:
        self.world, self.run, self.every, self._status = world, run, every, status
        self.beat = Heartbeat(world.rank)
        self.beat.on_enter = on_enter
        self.beat.attach(model, optimizer, ddp=model if world.launched else None)
        self.stragglers = Stragglers() if world.is_main else None
        self.watchdog = Watchdog(self.beat, files, world.size, timeout=timeout, on_hang=self._hung)

    def __enter__(self) -> HangGuard:
        self.watchdog.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.watchdog.__exit__(*exc)
        self._status = None  # the run's state, which holds this guard: no cycle after the loop

    @contextlib.contextmanager
    def step(self, step: int, monitor: Any) -> Iterator[None]:
        """Step ``step`` starts: its "data" phase. When the block ends (not by an exception), every ``every``
        steps: every rank's seconds per step (a collective); rank 0 (``monitor`` not None) logs them and
        alerts on a new straggler."""
        self.beat.enter("data", step)
        yield
        if step % self.every:
            return
        times = gather(self.beat.take_times())
        if monitor is None:
            return
        monitor.log_ranks(step, times)
        for rank, busy, others in self.stragglers.update(times):
            monitor.alert("straggler", self.stragglers.alert_text(rank, busy, others), step)

    def enter(self, phase: str) -> None:
        """A phase of its own inside a step ("save", "eval")."""
        self.beat.enter(phase)

    def each(self, items: Iterable, phase: str) -> Iterator:
        """``items`` with a heartbeat before each one: a long evaluation is progress."""
        return self.beat.each(items, phase)

    def _hung(self, report: HangReport) -> None:
        """The watchdog's report: rank 0 writes status.json "hung" before the job ends."""
        if self.run is not None and self._status is not None:
            status = self._status()
            self.run.ended(ExitCode.HUNG, status.pop("step"), report.message, stuck=report.stuck,
                           hang_folder=report.folder, **status)
