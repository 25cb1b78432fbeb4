"""Checkpoints written in the background: the training loop waits only for a copy of the state.

A synchronous ``CheckpointManager.save`` stops the loop for the whole write (serialise, hash,
fsync). ``AsyncCheckpointManager`` (opt-in, same files, same retention) splits it:

1. ``save`` copies every tensor of the state into host buffers that this manager keeps and
   reuses (pinned memory for CUDA tensors), the only part the loop waits for;
2. a background thread writes that copy with ``durable.save_verified``, publishes ``best.pt`` /
   ``last_good.pt`` and prunes, exactly as the synchronous manager does, while training goes on.

The price: one state's worth of host memory, and the errors arrive later. At most one save is
in flight: the next ``save``, ``wait()`` and every method that reads the folder wait for it,
and its error (a full disk...) is raised there or at ``check()``, which never waits. Call
``check()`` once per step and ``wait()`` before the process reports that the run ended. A kill
during a background write leaves the previous checkpoints, as a kill during a synchronous one does.

Example::

    manager = AsyncCheckpointManager(out / "checkpoints", every_steps=500)
    ...
        manager.check()                      # every step: a failed background save stops the run here
        if manager.should_save(step):
            manager.save(training_state(...), step)   # returns after the copy
    manager.wait()                           # the last save is on disk

Taught in ``04_checkpoint_resume`` §6 (the loop's stall, measured against a synchronous save).
"""
from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from course_utils.checkpoint import CheckpointManager, LoadedCheckpoint

__all__ = ["AsyncCheckpointManager"]


class AsyncCheckpointManager(CheckpointManager):
    """``CheckpointManager`` whose ``save`` returns once the state is copied; a thread writes the files."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer: threading.Thread | None = None  # the save in flight
        self._error: BaseException | None = None  # what it raised, until check()/wait() raises it here
        self._staging: list[torch.UntypedStorage] = []  # host copies of the state's storages, reused

    def save(self, state: dict[str, Any], step: int, metric: float | None = None, *, healthy: bool = True) -> Path:
        """As ``CheckpointManager.save``, but the file is written after this returns (first waiting
        for the previous save, whose error is raised here)."""
        self.wait()
        return super().save(state, step, metric, healthy=healthy)

    def _write(self, state: dict[str, Any], step: int, path: Path, publish: list[str]) -> None:
        self._writer = threading.Thread(target=self._write_in_background, name=f"checkpoint {path.name}",
                                        args=(self.stage(state), step, path, publish))
        self._writer.start()

    def _write_in_background(self, *args: Any) -> None:
        try:
            super()._write(*args)
        except BaseException as exc:  # raised in the training loop by check()/wait()/the next save
            self._error = exc

    def check(self) -> None:
        """Raise the error of a background save that failed, without waiting; else nothing."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait(self) -> None:
        """Block until the save in flight is on disk; raise its error if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self.check()

    @property
    def saving(self) -> bool:
        """True while a background save is being written."""
        return self._writer is not None and self._writer.is_alive()

    # Everything that reads the folder first waits for the save in flight.
    def load_latest(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        self.wait()
        return super().load_latest(map_location)

    def load_last_good(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        self.wait()
        return super().load_last_good(map_location)

    def last_good_step(self) -> int | None:
        self.wait()
        return super().last_good_step()

    def set_aside(self, after_step: int, also_copy: tuple[Path, ...] = ()) -> list[Path]:
        self.wait()
        return super().set_aside(after_step, also_copy)

    def remove_leftovers(self) -> list[Path]:
        self.wait()
        return super().remove_leftovers()

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` whose tensors live in this manager's host buffers: what the thread writes.

        Each storage is copied whole, once, so tensors that share memory still share it and the
        file is what ``torch.save(state)`` would write (CUDA tensors become CPU tensors;
        ``map_location`` on load puts them back). The buffers are reused by the next save when
        the sizes match: a fresh allocation costs page faults, a pinned one much more. Other
        values (and sparse, quantized or subclass tensors) are deep-copied.
        """
        copies: dict[tuple, torch.UntypedStorage] = {}  # one host copy per source storage
        memo: dict[int, Any] = {}  # copy.deepcopy's memo: each tensor -> its staged view
        gpus = set()
        for tensor in _tensors(state):
            if id(tensor) in memo or not _plain_dense(tensor):
                continue
            source = tensor.untyped_storage()
            key = (source.data_ptr(), source.device, source.nbytes())
            if key not in copies:
                copies[key] = self._staging_buffer(len(copies), source)
                copies[key].copy_(source, non_blocking=source.device.type == "cuda")
                if source.device.type == "cuda":
                    gpus.add(source.device)
            memo[id(tensor)] = torch.empty(0, dtype=tensor.dtype).set_(
                copies[key], tensor.storage_offset(), tensor.size(), tensor.stride())
        for gpu in gpus:
            torch.cuda.synchronize(gpu)  # the non-blocking copies are done before the writer reads them
        return copy.deepcopy(state, memo)

    def _staging_buffer(self, index: int, source: torch.UntypedStorage) -> torch.UntypedStorage:
        """The ``index``-th host buffer, reallocated when ``source`` no longer fits it exactly."""
        pinned = source.device.type == "cuda"
        if index < len(self._staging):
            buffer = self._staging[index]
            if buffer.nbytes() == source.nbytes() and (buffer.is_pinned() or not pinned):
                return buffer
        buffer = torch.empty(source.nbytes(), dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        self._staging[index:index + 1] = [buffer]
        return buffer


def _plain_dense(tensor: torch.Tensor) -> bool:
    """A tensor that is fully described by its storage, dtype, offset, size and stride."""
    return (type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout == torch.strided
            and not (tensor.is_quantized or tensor.is_conj() or tensor.is_neg()))


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors inside nested dicts, lists and tuples (a state dict's containers)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)
