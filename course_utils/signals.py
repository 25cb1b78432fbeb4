"""A clean stop: SIGTERM and Ctrl-C become a flag the training loop checks at a step boundary.

What: ``StopSignal`` replaces the default handlers of SIGTERM and SIGINT by one that sets
``requested`` (the signal's name); the loop checks it after each optimizer step, saves a
checkpoint and exits with ``status.json`` "preempted" (``course_utils.runfolder``).

Why: schedulers stop a job with SIGTERM (Slurm ``scancel``, Kubernetes, systemd) and give it
a grace period before SIGKILL; a process killed by the default handler loses everything since
its last save, and a process stopped in the middle of ``optimizer.step()`` saves a state no
resume can match. A second Ctrl-C while waiting for the step to end stops hard (the default).

Pitfall: the DataLoader workers. A SIGTERM sent to the whole process group (what schedulers
do) reaches the workers too, and a torch worker dies on a SIGTERM that does not come from its
parent; the main process then fails with "DataLoader worker exited unexpectedly" before it can
save. ``iterate(loader)`` starts the workers with both signals blocked and makes them ignore
both, so only the main process reacts. (Blocking matters: a signal that arrives while a worker
starts, before it can ignore it, would kill it.)

Only the standard library is imported: a script installs it before it imports torch.

Example::

    with StopSignal() as stop:
        for x, y in stop.iterate(loader):
            train_step(x, y)
            if stop.requested:      # "SIGTERM" or "SIGINT"
                save(); break

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (no notebook calls it; its tests send
the signals). What it does is described in prose in 04 §3 (SIGTERM / Ctrl-C only set a flag, the loop
saves at a step boundary; the demo kills with SIGKILL, the worst case) and 11 §9 (a stop on any rank
stops every rank at the same step).
"""
from __future__ import annotations

import signal
from typing import Any, Iterator

__all__ = ["StopSignal"]


class StopSignal:
    """Context manager: SIGTERM and SIGINT set ``requested`` instead of killing the process."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> "StopSignal":
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    install = __enter__  # for a script that installs it once, at the very start

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def iterate(self, loader: Any) -> Iterator:
        """``iter(loader)`` whose worker processes leave SIGTERM/SIGINT to this (main) process.

        The workers are forked with both signals blocked, so a signal that arrives while
        they start stays pending; their ``worker_init_fn`` then ignores both (a pending
        signal that is ignored is discarded) before unblocking. Signals sent to the main
        process meanwhile are delivered once the workers exist.
        """
        if getattr(loader, "num_workers", 0) > 0:
            loader.worker_init_fn = _WorkerInit(loader.worker_init_fn)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            return iter(loader)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _WorkerInit:
    """A DataLoader ``worker_init_fn``: ignore SIGTERM/SIGINT, unblock them, then run the original one."""

    def __init__(self, then: Any = None) -> None:
        self.then = then.then if isinstance(then, _WorkerInit) else then

    def __call__(self, worker_id: int) -> None:
        for sig in StopSignal.SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, StopSignal.SIGNALS)
        if self.then is not None:
            self.then(worker_id)
