"""``--hang-timeout`` as one part of a run: heartbeats, the watchdog, the stragglers and status.json "hung".

What: ``HangGuard`` puts together what a training script needs against a job that stops without a word:
this rank's ``Heartbeat`` (``course_utils.heartbeat``) with hooks on the model and the optimizer, a
``Watchdog`` (``course_utils.watchdog``) while the loop runs, which on a hang makes rank 0 write status.json
"hung" through ``RunFolder.ended``, and every ``every`` steps each rank's time per step in metrics.jsonl
with a ``Stragglers`` alert (``course_utils.stragglers``). The script meets it where a step starts and ends,
where it saves and where it evaluates: the phases a stuck rank is named by.

Why a component: spread over a script, the same feature took ten places (fields, the loop, the save, the
evaluation, status writers, an alert text); here it is one object the loop calls.

Pitfalls handled:
- the times are gathered at the same steps on every rank (``step % every``): a collective that one rank
  skipped would hang the job it watches;
- the status of a hang is written by rank 0's watchdog thread while the main thread is stuck: ``status``
  is a function that reads the run's progress then, not a value taken at the start.

Example::

    guard = HangGuard(world, files, run, timeout=None, every=20)
    with guard.watching(ddp_model, optimizer, status=lambda: {"step": step}, ddp=ddp_model if world.launched else None):
        for step in range(1, total + 1):
            guard.step(step)                    # phase "data" of this step
            ...                                 # forward, backward, allreduce, optimizer: hooks
            guard.stepped(step, monitor)        # every 20 steps: every rank's times; rank 0 logs them

Reference machinery of ``solutions/homework/train_cifar_pro.py``.
"""
from __future__ import annotations

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
    """One rank's heartbeat, watchdog and straggler watch (see the module docstring).

    ``run``: rank 0's claimed folder (the status of a hang goes there), None on the other ranks;
    ``timeout``: ``--hang-timeout`` (None: automatic, 0: no watchdog); ``every``: steps between two
    gatherings of the ranks' times.
    """

    def __init__(self, world: World, files: RunFiles, run: RunFolder | None, *, timeout: float | None,
                 every: int) -> None:
        self.world, self.files, self.run, self.timeout, self.every = world, files, run, timeout, every
        self.beat = Heartbeat(world.rank)
        self.stragglers = Stragglers() if world.is_main else None

    def watching(self, model: Any, optimizer: Any, status: Callable[[], dict[str, Any]], ddp: Any = None) -> Watchdog:
        """The heartbeat's hooks on ``model`` and ``optimizer`` (and DDP's all-reduce), and the watchdog to run
        the loop in (``with``); ``status()``: status.json's fields at the moment of a hang (step, ...).

        Pitfall: ``status`` usually reads the run's own state; it is held by the watchdog only, not by this
        object, so that the run's state and this guard form no reference cycle (a cycle would keep the run's
        DataLoader workers alive after it ends, until the garbage collector runs: an interpreter exit then hangs).
        """
        self.beat.attach(model, optimizer, ddp=ddp)
        return Watchdog(self.beat, self.files, self.world.size, timeout=self.timeout,
                        on_hang=lambda report: self._hung(report, status))

    def step(self, step: int) -> None:
        """Step ``step`` starts: its "data" phase."""
        self.beat.enter("data", step)

    def stepped(self, step: int, monitor: Any) -> None:
        """After step ``step``, every ``every`` steps: every rank's seconds per step (a collective); rank 0
        (``monitor`` not None) logs them and alerts on a new straggler."""
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

    def _hung(self, report: HangReport, status: Callable[[], dict[str, Any]]) -> None:
        """The watchdog's report: rank 0 writes status.json "hung" before the job ends."""
        if self.run is not None:
            status = status()
            self.run.ended(ExitCode.HUNG, status.pop("step"), report.message, stuck=report.stuck,
                           hang_folder=report.folder, **status)
