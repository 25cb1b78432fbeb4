"""Roll back and skip: which global batches a rollback skips, on the record and in the checkpoint.

What: after a spike that is the data's fault, large runs (PaLM §5.1) reload a checkpoint saved
while training was healthy and skip the batches from there up to and past the bad one. This
module is the pure bookkeeping of that move: ``SkipSet.plan`` turns (the healthy checkpoint's
step and data position, the bad step and its data position, ``--skip-batches N``) into a
``RollbackRecord``: the skipped global batches are ``restored_position .. bad_position + N``
(inclusive). The training loop then asks ``SkipSet.next_position`` for the next batch to train.

Positions: a *global batch position* counts batches over the whole run,
``position = epoch * batches_per_epoch + batch_in_epoch``. The data order is a pure function of
``(seed, epoch, position)`` (``course_utils.data.epoch_order`` and ``make_loader(start_batch=...)``),
so a position names the same samples in every process and after every resume:
``SkipSet.samples(position)`` lists them, ``rank=r, world_size=w`` a rank's share.

Why records: a rollback changes what the run trained on. It must be visible (an ``event`` line
for ``metrics.jsonl``, a ``history_entry`` for ``status.json``, ``skipped_json`` for a file in the
run folder) and part of the checkpointed state (``state_dict`` / ``load_state_dict``): a run
killed after a rollback and resumed must skip the same batches, and every rank computes the same
skip set from the same inputs (nothing here depends on the rank or on an RNG).

The move itself: ``Rollback`` is ``--on-spike rollback`` as one part of a run. It holds the
policy (``--skip-batches``, ``--rollback-lr-factor``, ``--max-rollbacks``) and the ``SkipSet``, is a
checkpoint part (``state_dict`` / ``load_state_dict``), and a training loop meets it once: on the
bad-step alarm it calls ``recover``, which reloads the healthy checkpoint through the run's own
``load``/``go_back``/``save`` and writes the records. The global batch each step trains is the data side's
(``course_utils.run_batches.RunBatches``), which asks the ``SkipSet`` (``trained_position(step)``: the
``step``-th position no rollback skipped) only when rollbacks are on.

Example::

    skips = SkipSet(n=len(train), batch_size=128, seed=0)
    record = skips.plan(bad_step=812, bad_position=812, restored_step=700, restored_position=700,
                        skip_batches=200)              # skips positions 700 .. 1012
    position = skips.next_position(700)                # 1013: where the restored run continues
    metrics.write(record.event()); status["history"].append(record.history_entry())
    rollback = Rollback(skips, enabled=True, skip_batches=200)
    training_state(..., parts={"rollback": rollback})  # in the checkpoint: rollback.state_dict()

Taught in ``12_loss_spikes`` §5 (the skip set of a rollback). ``Rollback`` is reference machinery of
the professional script's ``--on-spike rollback`` (``solutions/homework/train_cifar_pro.py``): its
``roll_back`` calls ``Rollback.recover`` (plan the record, reload ``last_good.pt``, write the records),
its ``RunBatches`` asks ``SkipSet.trained_position``, every checkpoint's ``parts["rollback"]`` holds its
``state_dict()``, ``attach`` writes the events and ``SKIPPED_FILE``, and ``status.json``'s history comes
through ``RunFolder.history``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from course_utils.data import batches_per_epoch, epoch_order, rank_share
from course_utils.durable import atomic_write_text
from course_utils.runfolder import SKIPPED_FILE, RunFolder
from course_utils.sinks import read_metrics

__all__ = ["RollbackRecord", "SkipSet", "Rollback", "SKIPPED_FILE"]



@dataclass(frozen=True)
class RollbackRecord:
    """One rollback: the bad step, the healthy step restored, the global batch positions skipped (inclusive)."""

    number: int             # 1 for the run's first rollback
    bad_step: int           # the optimizer step whose batch raised the alarm
    restored_step: int      # the step of the healthy checkpoint that was reloaded
    first_position: int     # first skipped global batch position (the restored checkpoint's next batch)
    last_position: int      # last skipped position: the bad batch's plus the margin
    lr_factor: float = 1.0  # the lr is multiplied by this after the rollback

    def positions(self) -> range:
        """The skipped global batch positions."""
        return range(self.first_position, self.last_position + 1)

    def event(self) -> dict[str, Any]:
        """A ``metrics.jsonl`` line: ``{"split": "event", "event": "rollback", ...}`` (the plots mark it).

        Its ``step`` is the restored step, where the trajectory goes on: a resume drops the records
        after its checkpoint's step, and every checkpoint after the rollback keeps this line.
        """
        return {"split": "event", "event": "rollback", "step": self.restored_step, **asdict(self),
                "skipped": len(self.positions())}

    def history_entry(self) -> dict[str, Any]:
        """An entry of ``status.json``'s history."""
        return {"state": "rolled_back", "step": self.bad_step, "to_step": self.restored_step,
                "skipped_positions": [self.first_position, self.last_position], "lr_factor": self.lr_factor}


class SkipSet:
    """The global batches a run skips after its rollbacks, and the samples they hold.

    ``n``, ``batch_size``, ``seed``, ``shuffle`` and ``drop_last`` describe the data order exactly as
    ``course_utils.data.make_loader`` builds it; ``records`` are the rollbacks so far (in order).
    """

    def __init__(self, n: int, batch_size: int, seed: int, *, shuffle: bool = True, drop_last: bool = False,
                 records: tuple[RollbackRecord, ...] = ()) -> None:
        if n <= 0 or batch_size <= 0:
            raise ValueError(f"n 和 batch_size 应为正整数,实际是 n={n}, batch_size={batch_size}")
        self.n, self.batch_size, self.seed, self.shuffle, self.drop_last = n, batch_size, seed, shuffle, drop_last
        self.per_epoch = batches_per_epoch(n, batch_size, drop_last)
        self.records: list[RollbackRecord] = list(records)

    # --- the plan -------------------------------------------------------------------------------
    def plan(self, *, bad_step: int, bad_position: int, restored_step: int, restored_position: int,
             skip_batches: int, lr_factor: float = 1.0) -> RollbackRecord:
        """Record a rollback to ``restored_step`` after the alarm at ``bad_step`` and return its record.

        Skipped: every position from ``restored_position`` (the restored checkpoint's next batch)
        to ``bad_position + skip_batches``, inclusive: the batches trained since the healthy
        checkpoint, the bad one, and a margin of ``skip_batches`` after it.
        """
        if skip_batches < 0:
            raise ValueError(f"--skip-batches 不能为负,实际是 {skip_batches}")
        if not 0 <= restored_step <= bad_step:
            raise ValueError(f"回滚到的步 {restored_step} 应在 0 和出问题的步 {bad_step} 之间")
        if not 0 <= restored_position <= bad_position:
            raise ValueError(f"检查点的数据位置 {restored_position} 应在 0 和坏 batch 的位置 {bad_position} 之间")
        if self.is_skipped(bad_position):
            raise ValueError(f"位置 {bad_position} 已经被跳过,不可能是刚训练的坏 batch")
        if not lr_factor > 0:
            raise ValueError(f"lr_factor 应为正数,实际是 {lr_factor}")
        record = RollbackRecord(len(self.records) + 1, int(bad_step), int(restored_step), int(restored_position),
                                int(bad_position) + int(skip_batches), float(lr_factor))
        self.records.append(record)
        return record

    # --- queries --------------------------------------------------------------------------------
    def is_skipped(self, position: int) -> bool:
        return any(r.first_position <= position <= r.last_position for r in self.records)

    def next_position(self, position: int) -> int:
        """The first position at or after ``position`` that is not skipped (where training goes on)."""
        moved = True
        while moved:
            moved = False
            for r in self.records:
                if r.first_position <= position <= r.last_position:
                    position, moved = r.last_position + 1, True
        return position

    def trained_position(self, step: int) -> int:
        """The global batch position that the step after ``step`` trains: the ``step``-th (from 0) not skipped.

        A run goes back only to a checkpoint saved after every earlier rollback, so that is the batch order of
        every trajectory. (``position(epoch, batch_in_epoch)`` is another thing: a position's coordinates.)
        """
        position = step
        for first, last in _merged((r.first_position, r.last_position) for r in self.records):
            if first > position:
                break
            position += last - first + 1
        return position

    def lr_scale(self) -> float:
        """What the run's lr is multiplied by after its rollbacks: the product of their ``lr_factor``."""
        return math.prod(r.lr_factor for r in self.records)

    def skipped_positions(self) -> list[int]:
        """Every skipped position, sorted, each once (rollbacks may overlap)."""
        return sorted({p for r in self.records for p in r.positions()})

    def epoch_and_batch(self, position: int) -> tuple[int, int]:
        """``(epoch, batch_in_epoch)`` of a global position: what ``make_loader(epoch=, start_batch=)`` takes."""
        return divmod(int(position), self.per_epoch)

    def position(self, epoch: int, batch_in_epoch: int) -> int:
        """The global position of batch ``batch_in_epoch`` of ``epoch``."""
        if not 0 <= batch_in_epoch < self.per_epoch:
            raise ValueError(f"batch_in_epoch 应在 [0, {self.per_epoch}) 之间,实际是 {batch_in_epoch}")
        return int(epoch) * self.per_epoch + int(batch_in_epoch)

    def samples(self, position: int, rank: int = 0, world_size: int = 1) -> list[int]:
        """The sample indices of global batch ``position`` (rank ``rank``'s share with ``world_size > 1``),
        the same list ``make_loader(..., epoch=e, start_batch=k)`` yields first."""
        epoch, k = self.epoch_and_batch(position)
        order = epoch_order(self.n, self.seed, epoch) if self.shuffle else range(self.n)
        batch = [int(i) for i in order[k * self.batch_size:(k + 1) * self.batch_size]]
        return batch[rank_share(len(batch), rank, world_size)]

    def skipped_samples(self) -> dict[int, list[int]]:
        """Skipped position -> its sample indices (the whole global batch)."""
        return {p: self.samples(p) for p in self.skipped_positions()}

    def skipped_json(self) -> str:
        """The text of the run folder's ``SKIPPED_FILE``: the rollbacks and every skipped sample."""
        samples = self.skipped_samples()
        return json.dumps({"data": {"n": self.n, "batch_size": self.batch_size, "seed": self.seed,
                                    "shuffle": self.shuffle, "drop_last": self.drop_last},
                           "rollbacks": [asdict(r) for r in self.records],
                           "skipped_batches": len(samples),
                           "skipped_fraction_of_an_epoch": len(samples) / self.per_epoch,
                           "positions": {str(p): s for p, s in samples.items()}}, indent=1)

    # --- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain ints, floats and lists: loads with ``torch.load(weights_only=True)``."""
        return {"n": self.n, "batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "records": [asdict(r) for r in self.records]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rollbacks; the data order must be the one this set was built for."""
        mine = (self.n, self.batch_size, self.seed, self.shuffle, self.drop_last)
        saved = (state["n"], state["batch_size"], state["seed"], state["shuffle"], state["drop_last"])
        if mine != saved:
            raise ValueError(f"检查点里的跳过记录属于另一种数据顺序 (n, batch, seed, shuffle, drop_last)={saved},"
                             f"本次运行是 {mine}")
        self.records = [RollbackRecord(**r) for r in state["records"]]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SkipSet) and self.state_dict() == other.state_dict()

    __hash__ = None  # mutable


class Rollback:
    """``--on-spike rollback``: back to the healthy checkpoint, the batches from it to the bad one skipped.

    ``enabled`` False (``--on-spike stop``): ``recover`` always declines and nothing is ever skipped.
    ``run``: rank 0's claimed folder, where the records go (``status.json``'s history through
    ``RunFolder.history``, ``SKIPPED_FILE``, and ``attach``'s monitor's ``metrics.jsonl``); None
    on the other ranks, which compute the same skips from the same inputs and write nothing.
    Pitfall: a checkpoint's part is loaded into a live object; the healthy checkpoint a rollback
    reloads holds fewer records than this one, and ``load_state_dict`` then keeps the newer ones.
    """

    def __init__(self, skips: SkipSet, *, enabled: bool, skip_batches: int = 0, lr_factor: float = 1.0,
                 max_rollbacks: int = 3, run: RunFolder | None = None) -> None:
        self.skips, self.enabled, self.run = skips, enabled, run
        self.skip_batches, self.lr_factor, self.max_rollbacks = skip_batches, lr_factor, max_rollbacks
        self.monitor: Any = None  # rank 0's, from attach
        self._pending: RollbackRecord | None = None  # the rollback under way: its records wait for its checkpoint

    def position(self, step: int) -> int:
        """The global batch position that the step after ``step`` trains (``SkipSet.trained_position``)."""
        return self.skips.trained_position(step)

    def lr_scale(self) -> float:
        """What the run's lr is multiplied by after its rollbacks."""
        return self.skips.lr_scale()

    def recover(self, step: int, *, load: Callable[[], Any], go_back: Callable[[Any], None],
                save: Callable[[], None]) -> bool:
        """The alarm fired at ``step`` (every rank at once): roll back, or say False (stop as ``--on-spike stop``).

        ``load()``: the healthy checkpoint on every rank (a ``LoadedCheckpoint``), None if there is none yet;
        ``go_back(found)``: the run restored from it, every part included (this one keeps its new record);
        ``save()``: a checkpoint of the restored step with the new skips, before the records are written.
        A kill before that save resumes before the spike and replays the same steps to the same rollback;
        a kill after it only misses records, which the resume writes (``attach``).
        """
        if not self.enabled or len(self.skips.records) >= self.max_rollbacks:
            return False
        started = time.perf_counter()
        found = load()
        if found is None:
            return False
        restored = found.state["step"]
        self._pending = self.skips.plan(bad_step=step, bad_position=self.position(step - 1), restored_step=restored,
                                        restored_position=self.position(restored), skip_batches=self.skip_batches,
                                        lr_factor=self.lr_factor)
        self._sync_history()
        go_back(found)
        save()
        record, self._pending = self._pending, None
        if self.run is not None:
            self._publish(seconds=time.perf_counter() - started)
            self.monitor.alert("rolled back", f"step {record.bad_step}: 坏步太多,第 {record.number}/{self.max_rollbacks} "
                               f"次回滚到 step {record.restored_step}(last_good.pt),跳过全局 batch "
                               f"{record.first_position}–{record.last_position}(共 {len(record.positions())} 个,"
                               f"见 {SKIPPED_FILE}),lr ×{self.lr_scale():g}", record.bad_step)
        return True

    def stop_message(self, step: int, bad: int, window: int, last_good: int | None) -> str:
        """What the run says when the alarm stops it (``recover`` declined): ``bad`` bad steps in the last ``window``
        at ``step``; ``last_good``: the step ``last_good.pt`` holds (None: none yet), where --resume continues."""
        where = (f"最后一个健康的检查点是 last_good.pt(step {last_good}),之后的检查点可能已含发散的权重,"
                 "--resume 会从 last_good.pt 继续" if last_good is not None else
                 "还没有健康的检查点,--resume 会从 step 0 重新开始")
        rolled = (f"已回滚 {len(self.skips.records)} 次(--max-rollbacks {self.max_rollbacks})仍然出现,"
                  if self.skips.records else "")
        return (f"最近 {window} 步里有 {bad} 个坏步(inf/NaN 或 loss 尖峰),{rolled}在 step {step} 停止训练。{where};"
                "先降低学习率(--resume --lr 更小的值 --allow-change lr)或检查数据")

    def attach(self, monitor: Any) -> None:
        """Rank 0: the records go to this monitor from now on; a resume writes what a kill left unwritten."""
        self.monitor = monitor
        if self._pending is None and self.skips.records:
            self._publish()

    def _publish(self, seconds: float | None = None) -> None:
        """A ``rollback`` event per rollback not yet in metrics.jsonl (``seconds``: how long the newest took),
        and ``SKIPPED_FILE``."""
        written = {r.get("number") for r in read_metrics(self.monitor.path) if r.get("event") == "rollback"}
        for record in self.skips.records:
            if record.number not in written:
                last = record is self.skips.records[-1] and seconds is not None
                self.monitor.event({**record.event(), **({"seconds": round(seconds, 4)} if last else {})})
        atomic_write_text(self.run.files.skipped, self.skips.skipped_json())

    def _sync_history(self) -> None:
        if self.run is not None:
            self.run.history = [r.history_entry() for r in self.skips.records]

    def state_dict(self) -> dict[str, Any]:
        """The skip set (checkpoints before the registry also held the data position, now derived)."""
        return {"skips": self.skips.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = list(self.skips.records)
        self.skips.load_state_dict(state["skips"])  # checks that the data order is this run's
        if mine[:len(self.skips.records)] == self.skips.records:  # this process rolled back past that checkpoint
            self.skips.records = mine
        self._sync_history()


def _merged(intervals) -> list[tuple[int, int]]:
    """Inclusive intervals, sorted and merged where they overlap or touch."""
    merged: list[list[int]] = []
    for first, last in sorted(intervals):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return [tuple(m) for m in merged]
