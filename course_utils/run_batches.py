"""The data side of a training run: which global batch each step trains, and this rank's share of it.

What: ``RunBatches`` owns a run's data position. ``next(step)`` gives the batch that the step after
``step`` trains: its global position (``position = epoch * per_epoch + batch_in_epoch``, see
``course_utils.rollback``), read through ``make_loader`` (``course_utils.data``), whose order depends only
on ``(seed, epoch)``. ``restart(step)`` after a resume or a rollback; ``saved()`` is what a checkpoint
records of the position (the epoch and the batch in it of the next batch the loader yields).

Why: exact resume needs the position in the checkpoint and a loader that starts at any batch of any
epoch; a rollback (``--on-spike rollback``) skips batches, so the step-th step does not always train the
step-th batch. With ``skips`` None nothing is skipped and the position is the step; with a ``SkipSet`` it
is ``skips.trained_position(step)``.

Pitfalls handled:
- a new loader at each epoch's start, after a skip, a resume or a rollback, and only then: the old
  iterator (its workers, its queue threads) is released first (a hang at that point was seen once after
  a rollback: rank 1 waited forever; not seen since);
- past the last epoch the data goes on into the next, so a run that skipped still trains its steps;
- under torchrun each rank reads its share of every global batch of ``batch_size`` (``rank_share``);
- a batch size that cannot work (larger than the data, smaller than the ranks, cut into more micro-batches
  than a rank has samples) is refused by ``check`` in one line, before the model is built.

Example::

    batches = RunBatches(train_set, 128, seed=0, world=world, stop=stop, workers=2)
    batches.check(accum_steps=4)                # Refused: --batch-size or --accum-steps cannot work
    batches.restart(step)                       # where a resumed run continues
    epoch, position, x, y = batches.next(step)  # the batch of step + 1
    state = {**batches.saved(), ...}            # {"epoch": ..., "batch_in_epoch": ...}

Reference machinery of ``solutions/homework/train_cifar_pro.py``.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, Dataset

from course_utils.data import batches_per_epoch, make_loader
from course_utils.distributed import World
from course_utils.runfolder import Refused

__all__ = ["RunBatches"]


class RunBatches:
    """This rank's share of the run's global batches, from any position (see the module docstring).

    ``stop``: a ``course_utils.signals.StopSignal`` whose ``iterate`` starts the loader (its workers leave
    SIGTERM to the trainer); ``skips``: the rollbacks' ``SkipSet``, None when nothing is ever skipped.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, seed: int, world: World, stop: Any = None,
                 workers: int = 0, pin_memory: bool = False, skips: Any = None) -> None:
        self.dataset, self.batch_size, self.seed, self.world = dataset, batch_size, seed, world
        self.stop, self.workers, self.pin_memory, self.skips = stop, workers, pin_memory, skips
        self.per_epoch = batches_per_epoch(len(dataset), batch_size, drop_last=True)
        self.position = 0  # the global position of the next batch the current loader yields
        self.loader: DataLoader | None = None  # this rank's loader of the current run of batches
        self._batches: Iterator | None = None  # its iterator; None: the next batch starts a new loader

    def check(self, accum_steps: int = 1) -> None:
        """Refuse (``Refused``, one line) a global batch the run cannot train: larger than the data set, smaller
        than the number of ranks, or cut into ``accum_steps`` micro-batches when a rank has fewer samples."""
        size, ranks = self.batch_size, self.world.size
        if self.per_epoch == 0:
            raise Refused(f"--batch-size {size} 大于训练集({len(self.dataset)} 张);请调小 --batch-size")
        if size < ranks:
            raise Refused(f"--batch-size {size} 是全局 batch,小于进程数 {ranks}:每个进程至少要分到 1 个样本")
        if accum_steps > size // ranks:
            raise Refused(f"--accum-steps {accum_steps} 大于每个进程每步的样本数 {size // ranks}"
                          f"(--batch-size {size} 是全局 batch,{ranks} 个进程):每个微批次至少要有 1 个样本")

    def position_of(self, step: int) -> int:
        """The global position of the batch that the step after ``step`` trains."""
        return step if self.skips is None else self.skips.trained_position(step)

    def restart(self, step: int) -> None:
        """The run stands at ``step`` (a resume, a rollback): the next batch starts a new loader."""
        self.position, self._batches = self.position_of(step), None

    def next(self, step: int) -> tuple[int, int, Any, Any]:
        """(epoch, global position, this rank's images, labels) of the batch that the step after ``step`` trains."""
        position = self.position_of(step)
        epoch, start_batch = divmod(position, self.per_epoch)
        if self._batches is None or position != self.position or start_batch == 0:
            self._batches = None  # released before the next loader starts its workers
            self.loader = make_loader(self.dataset, self.batch_size, seed=self.seed, epoch=epoch,
                                      start_batch=start_batch, num_workers=self.workers, drop_last=True,
                                      pin_memory=self.pin_memory, rank=self.world.rank, world_size=self.world.size)
            self._batches = self.stop.iterate(self.loader) if self.stop is not None else iter(self.loader)
        self.position = position + 1
        return epoch, position, *next(self._batches)

    def saved(self) -> dict[str, int]:
        """What a checkpoint records of the position: the epoch and batch of the next batch the loader yields."""
        return {"epoch": self.position // self.per_epoch, "batch_in_epoch": self.position % self.per_epoch}
