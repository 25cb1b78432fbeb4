"""What a test or a demo attaches to a run of the professional script: its hidden flags.

``solutions/homework/train_cifar_pro.py`` takes ``--inject-nan-at-step``, ``--inject-bad-batch``,
``--sample-ledger`` and the hang probes ``--inject-stall``, ``--inject-stuck-worker``, ``--inject-straggler``
(not in ``--help``) and hands them to ``Probes``, imported only when one of them is given; its loop only
calls a ``Hooks`` object (the script's own no-op one otherwise: a copy of the script needs no course
machinery), so neither the loop nor ``train_step`` knows what a test does (CONTRIBUTING "One fact, one place").

Reference machinery of the tests (``tests/test_train_pro*.py``, ``tests/test_ddp_script.py``)
and of the spike demos of ``solutions/12_loss_spikes.ipynb``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch

from course_utils.distributed import World, gather
from course_utils.heartbeat import PHASES
from course_utils.runfolder import RunFiles

__all__ = ["Probes"]


class Probes:
    """The hidden flags, for tests and demos; the loop and ``train_step`` know nothing of them.

    The script's ``Hooks``, doing something: ``data(dataset)``: the training set (or what to load instead);
    ``attach(model)``: once, before the first step; ``phase_entered(step, phase)``: the rank's heartbeat enters a
    phase (``course_utils.hang_guard.HangGuard``'s ``on_enter``); ``before_step(step, position, x, y)``: the batch of
    global position ``position`` that step ``step`` is about to train on (or what to train on instead);
    ``after_step(step, loader, y)``: after every optimizer step.

    ``--inject-nan-at-step N,M``: at those steps the model's output (so the loss and every gradient) is NaN on every
    rank: the skip, the alert and the bad-step stop; a step trained again after a rollback is poisoned again (a
    fault of the step, like a schedule error). ``--inject-bad-batch P,Q``: the images of the global batches at
    positions P, Q are NaN (a corrupted batch: a fault of the data, which a rollback skips). ``--sample-ledger``:
    rank 0 appends to ``RunFiles.ledger`` one line per step: the sample indices and labels each rank trained on.

    Hangs (tests and 11 §10): ``--inject-stall RANK:STEP:PHASE:NTH,...``: that rank freezes itself (SIGSTOP) as it
    enters PHASE of STEP for the NTH time (forward and backward: once per micro-batch with --accum-steps); the i-th
    entry only in attempt i of a torchrun job (``TORCHELASTIC_RESTART_COUNT``; a plain run is attempt 0), so a job
    restarted by ``--max-restarts`` meets the next one. ``--inject-stuck-worker N``: a DataLoader worker freezes
    itself as it loads its N-th sample (a stuck read). ``--inject-straggler RANK:SECONDS``: that rank sleeps so long
    in every data phase (slow, not stuck).
    """

    def __init__(self, args: argparse.Namespace, world: World, files: RunFiles) -> None:
        self.nan_steps, self.bad_batches = set(args.inject_nan_at_step), set(args.inject_bad_batch)
        self.ledger = files.ledger if args.sample_ledger else None
        self.world = world
        self.step, self.loader, self.shares = 0, None, None
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        stalls = args.inject_stall  # (rank, step, index of the phase in PHASES, nth entry), one per attempt
        self.stall = (stalls[attempt][1], PHASES[stalls[attempt][2]]) \
            if attempt < len(stalls) and stalls[attempt][0] == world.rank else None
        self.stall_countdown = stalls[attempt][3] if self.stall else 0
        self.stuck_worker = args.inject_stuck_worker
        self.straggle = dict(args.inject_straggler).get(world.rank, 0.0)

    def data(self, dataset: torch.utils.data.Dataset) -> torch.utils.data.Dataset:
        return _StuckWorker(dataset, self.stuck_worker) if self.stuck_worker else dataset

    def attach(self, model: torch.nn.Module) -> None:
        if self.nan_steps:
            model.register_forward_hook(self.poison)

    def phase_entered(self, step: int, phase: str) -> None:
        if self.stall is None or (step, phase) != self.stall:
            return
        self.stall_countdown -= 1
        if self.stall_countdown == 0:
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, its watchdog thread included

    def before_step(self, step: int, position: int, x: torch.Tensor,
                    y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.step = step
        if self.straggle:
            time.sleep(self.straggle)
        return (x * float("nan"), y) if position in self.bad_batches else (x, y)

    def poison(self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
        """A forward hook: NaN outputs in the training forward of a chosen step (evaluation is left alone)."""
        return output * float("nan") if module.training and self.step in self.nan_steps else None

    def after_step(self, step: int, loader: torch.utils.data.DataLoader, y: torch.Tensor) -> None:
        if self.ledger is None:
            return
        if loader is not self.loader:  # a new epoch (or a resume): this rank's batches of indices, in step with it
            self.loader, self.shares = loader, iter(loader.batch_sampler)
        ledger = gather((next(self.shares), y.tolist()))
        if self.world.is_main:
            with open(self.ledger, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "world_size": self.world.size, "indices": [i for i, _ in ledger],
                                    "labels": [labels for _, labels in ledger]}) + "\n")


class _StuckWorker(torch.utils.data.Dataset):
    """``dataset``, except that a DataLoader worker freezes itself (SIGSTOP) as it loads its ``n``-th sample."""

    def __init__(self, dataset: torch.utils.data.Dataset, n: int) -> None:
        self.dataset, self.n, self.loaded = dataset, n, 0

    def __getattr__(self, name: str):  # source, set_epoch...: the wrapped dataset's
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        if torch.utils.data.get_worker_info() is not None:
            self.loaded += 1
            if self.loaded == self.n:
                os.kill(os.getpid(), signal.SIGSTOP)
        return self.dataset[i]
