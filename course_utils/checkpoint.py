"""Checkpoints that make a killed run continue as if nothing happened.

A weights-only checkpoint gives a run amnesia: AdamW's moments restart at zero, the lr
schedule starts over, the data order and RNG streams replay. The full state is
``training_state(...)``: model, optimizer, scheduler, GradScaler, EMA, epoch, global step,
position inside the epoch, all RNG states, the run config and the best metric;
``restore_training_state`` puts it back (model shapes checked first, RNG last). Anything else a
run must carry over (the professional script's monitor alarms and rollback records) is a *part*:
an object with its own ``state_dict``/``load_state_dict``, registered by name (``parts=``), saved
under ``state["parts"][name]`` and loaded back into the object of the same name (torchtitan's
stateful parts). Checkpoints written before the registry held the same dicts under
``state["extra"][name]``; ``saved_parts`` reads either.

``CheckpointManager`` keeps them in one folder:

- every save is ``durable.save_verified``: temp file, fsync, ``os.replace``, a checksum beside
  the file. ``load_latest`` loads the newest file that passes its checksum; a truncated or
  damaged one is skipped with a warning and the next older one is used;
- retention: the newest ``keep_last`` (2) ``step_<N>.pt`` files, plus ``best.pt`` (best metric)
  and, with ``keep_last_good=True``, ``last_good.pt`` (the newest one saved while training
  was healthy: a blow-up must not push every good state out). Both are hard links to the
  step file (no second serialisation, no extra space). Pruning only looks at files older
  than the one just written, and never deletes the file this manager loaded;
- ``should_save(step)``: every ``every_steps`` steps and/or every ``every_seconds`` of wall time;
- loads use ``torch.load(weights_only=True)``: nothing needs arbitrary unpickling.

Machinery of the professional script (``solutions/homework/train_cifar_pro.py``), not taught:
``set_aside`` moves the files newer than the resume point into ``superseded/`` or ``corrupt/``
(a rename, never a delete), ``remove_leftovers`` deletes what a killed save left behind.
``share_checkpoint`` makes every rank of a torchrun job load the file rank 0 chose. Saves that do
not stop the loop: ``course_utils.checkpoint_async.AsyncCheckpointManager``.

Example::

    manager = CheckpointManager(out / "checkpoints", every_steps=500, every_seconds=3600)
    found = manager.load_latest()
    if found:
        meta = restore_training_state(found.state, model=model, optimizer=opt, scheduler=sched)
    ...
    if manager.should_save(step):
        manager.save(training_state(model=model, optimizer=opt, scheduler=sched, epoch=e, step=step,
                                    batch_in_epoch=b), step, metric=val_acc)

Taught in ``04_checkpoint_resume`` §2 (the training state), §4 (retention), §5 (checksums and
the fallback, saving by time).
"""
from __future__ import annotations

import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Protocol

import torch
from torch import nn

from course_utils.distributed import World, broadcast, same_on_all_ranks
from course_utils.durable import (TEMP_FILE, CorruptCheckpointError, atomic_file, fsync_folder, load_verified,
                                  save_verified, sidecar, temp_name, write_all, write_sidecar)
from course_utils.repro import rng_state, set_rng_state
from course_utils.runfolder import Refused

__all__ = ["LoadedCheckpoint", "CorruptCheckpointError", "save_verified", "load_verified", "CheckpointManager",
           "share_checkpoint", "newest_step", "Stateful", "training_state", "saved_parts", "check_model_compatible", "restore_training_state"]

STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class Stateful(Protocol):
    """A part of a run that a checkpoint carries: ``state_dict()`` of plain values, and its inverse."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LoadedCheckpoint(NamedTuple):
    """What ``CheckpointManager.load_latest`` found: the file and its state dict."""

    path: Path
    state: dict[str, Any]


class CheckpointManager:
    """Rotating, checksummed checkpoints in one folder: ``step_<N>.pt`` plus ``best.pt`` (and ``last_good.pt``)."""

    def __init__(self, directory: str | os.PathLike, keep_last: int = 2, keep_best: bool = True,
                 every_steps: int | None = None, every_seconds: float | None = None, mode: str = "max",
                 keep_last_good: bool = False) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last 至少为 1,实际是 {keep_last}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode 只能是 'max' 或 'min',实际是 {mode!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_last, self.keep_best, self.keep_last_good, self.mode = keep_last, keep_best, keep_last_good, mode
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.best_metric: float | None = None
        self.protected: Path | None = None  # the file this manager loaded: never pruned
        self.corrupt: list[Path] = []  # files the last load_latest skipped
        self._last_save_time = time.monotonic()

    def checkpoints(self) -> list[Path]:
        """``step_<N>.pt`` files, oldest first."""
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := STEP_FILE.match(p.name))]
        return [p for _, p in sorted(found)]

    def should_save(self, step: int) -> bool:
        """True every ``every_steps`` steps, or once ``every_seconds`` have passed since the last save."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(self.every_seconds) and time.monotonic() - self._last_save_time >= self.every_seconds

    def is_better(self, metric: float) -> bool:
        """True if ``metric`` beats the best so far (``mode`` says whether higher or lower is better)."""
        if self.best_metric is None:
            return True
        return metric > self.best_metric if self.mode == "max" else metric < self.best_metric

    def save(self, state: dict[str, Any], step: int, metric: float | None = None, *, healthy: bool = True) -> Path:
        """Save ``state`` as ``step_<step>.pt``; also as ``best.pt`` if ``metric`` improved, and as
        ``last_good.pt`` if ``healthy`` and ``keep_last_good``; prune old files. Returns the path."""
        improved = metric is not None and self.keep_best and self.is_better(metric)
        if improved:
            self.best_metric = float(metric)
        state = {**state, "best_metric": self.best_metric}
        path = self.directory / f"step_{step:08d}.pt"
        publish = [name for name, wanted in (("best.pt", improved), ("last_good.pt", healthy and self.keep_last_good))
                   if wanted]
        self._write(state, step, path, publish)
        self._last_save_time = time.monotonic()
        return path

    def wait(self) -> None:
        """Nothing to wait for: a synchronous save is on disk when ``save`` returns."""

    def check(self) -> None:
        """Nothing to check: a synchronous save raises its error in ``save`` itself."""

    def _write(self, state: dict[str, Any], step: int, path: Path, publish: list[str]) -> None:
        digest = save_verified(state, path)
        for name in publish:
            self._publish(name, path, digest)
        self._prune(step)

    def _publish(self, name: str, path: Path, digest: str) -> None:
        """Make ``name`` the same bytes as ``path`` without serialising twice: a hard link, or a copy
        where the file system has none; atomic either way."""
        target, tmp = self.directory / name, temp_name(self.directory / name)
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
            os.replace(tmp, target)
            fsync_folder(self.directory)
        except OSError:  # no hard links here (some network and FAT file systems)
            tmp.unlink(missing_ok=True)
            with open(path, "rb") as source, atomic_file(target) as copy:
                while chunk := source.read(1 << 24):
                    write_all(copy, chunk)
        write_sidecar(target, digest)

    def _prune(self, saved_step: int) -> None:
        """Keep the newest ``keep_last`` files up to ``saved_step``; never touch newer files or ``protected``."""
        older = [p for p in self.checkpoints() if int(STEP_FILE.match(p.name).group(1)) < saved_step]
        for old in older[:max(0, len(older) - (self.keep_last - 1))]:
            if self.protected is not None and old.resolve() == self.protected.resolve():
                continue
            sidecar(old).unlink(missing_ok=True)
            old.unlink(missing_ok=True)

    def load_latest(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """The newest checkpoint that passes its checksum, or None. Skipped (corrupt) files are warned
        about and listed in ``corrupt``. The file loaded becomes ``protected``: pruning never deletes it."""
        self.corrupt = []
        for path in reversed(self.checkpoints()):
            found = self._load(path, map_location)
            if found is not None:
                return found
        return None

    def load_last_good(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """``last_good.pt`` (the newest checkpoint saved while healthy), or None."""
        path = self.directory / "last_good.pt"
        return self._load(path, map_location) if path.exists() else None

    def _load(self, path: Path, map_location: str | torch.device) -> LoadedCheckpoint | None:
        try:
            state = load_verified(path, map_location)
        except CorruptCheckpointError as exc:
            warnings.warn(f"跳过损坏的检查点 {exc};尝试更早的一个", stacklevel=3)
            self.corrupt.append(path)
            return None
        self.protected = path
        self.best_metric = state.get("best_metric")
        return LoadedCheckpoint(path, state)

    # ------------------------------------------------------------ machinery of the professional script
    def last_good_step(self) -> int | None:
        """The step ``last_good.pt`` holds, None if there is none (or it cannot be read)."""
        path = self.directory / "last_good.pt"
        return _peek_step(path) if path.exists() else None

    def set_aside(self, after_step: int, also_copy: tuple[Path, ...] = ()) -> list[Path]:
        """Move every checkpoint newer than ``after_step`` out of the way (a rename); return where they went.

        Call it once the resume point is chosen: those files belong to no trajectory this run will
        continue. A corrupt one (skipped by ``load_latest``, or unreadable) goes to ``corrupt/``, a
        valid one (say, the weights after a blow-up) to ``superseded/``; ``best.pt`` and
        ``last_good.pt`` too if they hold a later step. Nothing is deleted and a later resume can
        never pick them up. When anything moves, the files in ``also_copy`` (the metrics log that
        covers them) are copied into ``superseded/`` first.
        """
        moves = [(path, "corrupt" if path in self.corrupt else "superseded") for path in self.checkpoints()
                 if int(STEP_FILE.match(path.name).group(1)) > after_step]
        for name in ("best.pt", "last_good.pt"):
            path = self.directory / name
            if path.exists():
                step = _peek_step(path)
                if step is None or step > after_step:
                    moves.append((path, "corrupt" if step is None else "superseded"))
        copied = []
        for path in also_copy if moves else ():  # first: a kill between the two steps must not lose the copy
            if path.exists():
                copied.append(_free_name(self.directory / "superseded", path.name))
                shutil.copyfile(path, copied[-1])
        return [self._move(path, kind) for path, kind in moves] + copied

    def _move(self, path: Path, kind: str) -> Path:
        target = _free_name(self.directory / kind, path.name)
        if sidecar(path).exists():
            os.replace(sidecar(path), sidecar(target))
        os.replace(path, target)
        return target

    def remove_leftovers(self) -> list[Path]:
        """Delete what a killed save leaves behind: temp files (``durable.TEMP_FILE``) and sidecars whose
        checkpoint is gone. Only while no other process writes here (hold the run folder's lock)."""
        removed = []
        for path in self.directory.iterdir():
            orphan = path.name.endswith(".sha256") and not path.with_name(path.name[:-len(".sha256")]).exists()
            if path.is_file() and (TEMP_FILE.match(path.name) or orphan):
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed


def newest_step(directory: str | os.PathLike) -> int | None:
    """The step of the newest complete ``step_<N>.pt`` in ``directory`` (its checksum written last), None if none."""
    steps = [int(m.group(1)) for p in Path(directory).glob("step_*.pt.sha256") if (m := STEP_FILE.match(p.name[:-7]))]
    return max(steps, default=None)


def share_checkpoint(found: LoadedCheckpoint | None, directory: str | os.PathLike, world: World,
                     map_location: str | torch.device = "cpu", what: str = "检查点",
                     refusal: str | None = None) -> LoadedCheckpoint | None:
    """Every rank: the checkpoint rank 0 chose (``found`` on rank 0, None elsewhere), loaded from the same file
    of ``directory``; checked to be the same step everywhere (``RanksDisagree`` names ``what`` otherwise).

    ``refusal`` (rank 0's): every rank raises it as ``Refused``. In a plain run: ``found`` itself.
    """
    name, refusal = broadcast((found.path.name if found else None, refusal))
    if refusal:
        raise Refused(refusal)
    problem, path = None, Path(directory) / str(name)
    if name is not None and not world.is_main:
        try:
            found = LoadedCheckpoint(path, load_verified(path, map_location=map_location))
        except CorruptCheckpointError as exc:
            problem = f"读不到 {exc}(多机训练时 --out 须在各节点共享的文件系统上)"
    same_on_all_ranks(problem or (name, found.state["step"] if found else 0), what)
    return found


def _free_name(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/<stem>.<n><suffix>`` if taken (folder created if needed)."""
    folder.mkdir(exist_ok=True)
    target, n = folder / name, 1
    while target.exists():
        stem, dot, suffix = name.partition(".")
        target, n = folder / f"{stem}.{n}{dot}{suffix}", n + 1
    return target


def _peek_step(path: Path) -> int | None:
    """The ``step`` of a checkpoint without reading its tensors (``mmap``); None if it cannot be read."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:
        return None


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a ``DistributedDataParallel``/``DataParallel`` wrapper (their keys carry ``module.``)."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


def training_state(*, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, step: int,
                   batch_in_epoch: int = 0, scheduler: Any = None, scaler: torch.amp.GradScaler | None = None,
                   ema: Any = None, config: dict | None = None, extra: dict | None = None,
                   rng_states: list[dict[str, Any]] | None = None,
                   parts: Mapping[str, Stateful] | None = None) -> dict[str, Any]:
    """Everything needed to continue exactly: the chapter's five elements and the rest.

    Several processes: pass ``rng_states``, every rank's RNG state with rank r's at index r
    (``course_utils.distributed.gather_rng_states()``, on rank 0); the checkpoint then holds
    them all (``"rng_ranks"``). Without it: this process's state, as rank 0 of 1. ``"world_size"``
    records how many processes wrote the checkpoint (absent in older ones: 1).
    A DDP-wrapped ``model`` is saved unwrapped (no ``module.`` prefixes: loads with or without DDP).
    ``parts``: name -> a ``Stateful`` object; each one's ``state_dict()`` goes under ``"parts"``.
    """
    rng_states = rng_states or [rng_state()]
    state = {
        "model": _unwrapped(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": ema.state_dict() if ema is not None else None,
        "epoch": epoch,
        "step": step,
        "batch_in_epoch": batch_in_epoch,
        "rng": rng_states[0],  # rank 0's: what a single-process reader restores
        "world_size": len(rng_states),
        "config": config or {},
        "extra": extra or {},
    }
    if len(rng_states) > 1:
        state["rng_ranks"] = rng_states
    if parts:
        state["parts"] = {name: part.state_dict() for name, part in parts.items()}
    return state


def saved_parts(state: dict[str, Any]) -> dict[str, Any]:
    """name -> the saved ``state_dict`` of each part of a checkpoint; one written before the registry kept them
    under ``"extra"`` (the professional script's ``"monitor"`` and ``"rollback"``, in the same layout)."""
    return state["parts"] if "parts" in state else state.get("extra") or {}


def check_model_compatible(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Raise a clear error naming every missing, unexpected or reshaped tensor."""
    current = model.state_dict()
    problems = [f"{k}: 检查点 {tuple(saved[k].shape)} ≠ 当前 {tuple(v.shape)}"
                for k, v in current.items() if k in saved and saved[k].shape != v.shape]
    problems += [f"{k}: 当前模型有,检查点没有" for k in current if k not in saved]
    problems += [f"{k}: 检查点有,当前模型没有" for k in saved if k not in current]
    if problems:
        shown = "\n  ".join(problems[:8]) + ("\n  ..." if len(problems) > 8 else "")
        raise ValueError(f"检查点与当前模型结构不一致(是否改了模型宽度/层数的配置?):\n  {shown}")


def restore_training_state(state: dict[str, Any], *, model: nn.Module, optimizer: torch.optim.Optimizer,
                           scheduler: Any = None, scaler: torch.amp.GradScaler | None = None,
                           ema: Any = None, restore_rng: bool = True, rank: int = 0,
                           parts: Mapping[str, Stateful] | None = None) -> dict[str, Any]:
    """Load ``training_state`` output back into live objects; return epoch/step/position/extra.

    ``parts``: each one the checkpoint holds gets its state back (``saved_parts``); one it does not
    hold (a checkpoint older than the part) is left as it is.

    Restore order matters: RNG state last, after everything that might draw from it.
    Several processes: each rank passes its ``rank`` and gets its own RNG state back. A rank the
    checkpoint has no state for (the job grew beyond ``state["world_size"]`` processes) is an
    error unless ``restore_rng=False``; seed that rank's stream yourself
    (``course_utils.distributed.seed_rank``): a silently unrestored stream is how resumed runs drift.
    """
    model = _unwrapped(model)
    check_model_compatible(model, state["model"])
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and scaler.is_enabled():
        if not state.get("scaler"):
            raise ValueError("检查点没有 GradScaler 状态(它是 bf16/fp32 训练的),不能以 fp16 续训;请用原来的 --amp 设置")
        scaler.load_state_dict(state["scaler"])
    if ema is not None:
        if state.get("ema") is None:
            raise ValueError("检查点里没有 EMA 权重,但当前配置启用了 EMA")
        ema.load_state_dict(state["ema"])
    saved = saved_parts(state)
    for name, part in (parts or {}).items():
        if name in saved:
            part.load_state_dict(saved[name])
    rng_states = state.get("rng_ranks") or [state["rng"]]
    if restore_rng:
        if not 0 <= rank < len(rng_states):
            raise ValueError(f"检查点只有 {len(rng_states)} 个进程的随机数状态,没有 rank {rank} 的;"
                             "进程数变多时,新 rank 用 seed_rank 另设种子,并传 restore_rng=False")
        set_rng_state(rng_states[rank])
    return {k: state.get(k) for k in ("epoch", "step", "batch_in_epoch", "best_metric", "extra", "config")}
