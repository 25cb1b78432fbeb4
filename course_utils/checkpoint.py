"""Checkpoints that make a killed run continue as if nothing happened.

A weights-only checkpoint gives a run amnesia: AdamW's moments restart at zero,
the lr schedule starts over, the data order and RNG streams replay. The full
state is ``training_state(...)``: model, optimizer, scheduler, GradScaler, EMA,
epoch, global step, position inside the epoch, all RNG states, the run config
and the best metric.

``CheckpointManager`` makes the files safe:
- atomic writes: temp file in the same folder, fsync, ``os.replace``; a SHA-256
  checksum beside each file. A half-written or bit-flipped newest file is detected
  on load and the next valid one is used, with a warning;
- streaming: the checksum is computed while ``torch.save`` writes the bytes and while
  ``torch.load`` reads them, each time in a second thread, so a verified save or load
  costs about what a plain one does and never holds a second copy of the file in memory;
- asynchronous saves (``async_save=True``): the loop waits only for a copy of the
  state in host memory; a background thread writes the file. At most one save is in
  flight: the next ``save``, ``wait()`` and every method that reads the folder wait for
  it, and its error is raised there (or at ``check()``, which never waits);
- retention: the last ``keep_last`` (2) plus ``best.pt``, plus ``last_good.pt`` with
  ``keep_last_good=True`` (the newest checkpoint saved while training was healthy:
  a blow-up must not push every good state out of the folder). Pruning only looks
  at files older than the one just written, so a run never deletes its own newest
  checkpoints; the file a run resumed from is kept for as long as that manager lives;
- ``set_aside(step)``: on resume from ``step``, newer files (corrupt ones, or those of
  an abandoned trajectory) move to ``corrupt/`` or ``superseded/``, never deleted and
  never again mistaken for this run's; ``remove_leftovers()`` deletes the temp files
  and orphan checksums a kill leaves behind;
- saves every ``every_steps`` steps and/or every ``every_seconds`` of wall time;
- loads with ``torch.load(weights_only=True)``: nothing needs arbitrary unpickling.

``StopSignal`` (from ``course_utils.runfolder``) turns SIGTERM / Ctrl-C into a flag
the loop checks at a step boundary, so the run saves and exits cleanly.

Example::

    manager = CheckpointManager(out / "checkpoints", every_steps=500, every_seconds=3600)
    found = manager.load_latest()
    if found:
        meta = restore_training_state(found.state, model=model, optimizer=opt, scheduler=sched)
    ...
    if manager.should_save(step):
        manager.save(training_state(model=model, optimizer=opt, scheduler=sched, epoch=e, step=step,
                                    batch_in_epoch=b), step)

With ``CheckpointManager(..., async_save=True)`` the same ``save`` returns after copying the
state; call ``manager.check()`` once per step and ``manager.wait()`` before reporting that the
run ended.

Taught in ``04_checkpoint_resume`` §2–5.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import hashlib
import io
import mmap
import os
import re
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn

from course_utils.durable import TEMP_FILE as _TEMP_FILE, atomic_file as _atomic_file, atomic_write_bytes, write_all as _write_all
from course_utils.repro import rng_state, set_rng_state
from course_utils.runfolder import StopSignal

__all__ = ["LoadedCheckpoint", "CorruptCheckpointError", "atomic_write_bytes", "save_verified",
           "load_verified", "CheckpointManager", "training_state", "check_model_compatible",
           "restore_training_state", "StopSignal"]


_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class LoadedCheckpoint(NamedTuple):
    """What ``CheckpointManager.load_latest`` found: the file and its state dict."""

    path: Path
    state: dict[str, Any]


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file whose checksum is missing or does not match, or that cannot be loaded."""


class _HashingWriter:
    """The file object ``torch.save`` writes to: every byte goes to ``file`` and into a SHA-256.

    A large write (tensor data) is hashed in a helper thread while this thread writes the same
    bytes, and both finish before ``write`` returns: the memoryview ``torch.save`` passes is valid
    only during the call, and the hash must see the bytes in file order. Small writes (zip
    headers) are hashed inline. Never a copy of the checkpoint, no second pass over the file.
    Pitfall: the hash must not run after ``write`` returns (torch reuses or frees that memory), so a
    helper that falls behind would hash garbage; here every large write waits for its hash.
    ``torch.save`` turns an error raised in ``write`` into a ``RuntimeError`` without the cause:
    the first one is kept in ``error``.
    """

    PARALLEL_MIN = 1 << 20  # bytes: smaller writes are hashed inline

    def __init__(self, file: io.FileIO) -> None:
        self.file, self.error = file, None
        self._sha256 = hashlib.sha256()
        self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-sha256")

    def write(self, data: Any) -> int:
        if self.error is not None:
            raise self.error
        view = memoryview(data).cast("B")
        hashing = self._helper.submit(self._sha256.update, view) if len(view) >= self.PARALLEL_MIN else None
        try:
            n = _write_all(self.file, view)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            if hashing is not None:
                hashing.result()  # the view must outlive the hash
        if hashing is None:
            self._sha256.update(view)
        return n

    def flush(self) -> None:
        """Nothing to flush: every ``write`` went straight to the file."""

    def finish(self) -> None:
        """No more writes: stop the helper thread."""
        self._helper.shutdown(wait=True)

    def hexdigest(self) -> str:
        """The digest of everything written."""
        self.finish()
        return self._sha256.hexdigest()


_crc32_lock = threading.Lock()
_crc32_users = 0  # checkpoints being written with torch's CRC-32 off
_crc32_setting = True  # torch's setting before the first of them


@contextlib.contextmanager
def _without_crc32() -> Iterator[None]:
    """Skip the CRC-32 that ``torch.save`` computes of every record, serially, in the writing thread.

    The SHA-256 covers every byte already, and ``torch.load`` never checks the CRC (only tools
    that unzip a ``.pt`` file would complain). It is a process-wide option of torch: a
    ``torch.save`` in another thread while a checkpoint is written skips it too. Restored when
    the last checkpoint being written is done.
    """
    global _crc32_users, _crc32_setting
    if not hasattr(torch.serialization, "set_crc32_options"):  # an older torch always computes it
        yield
        return
    with _crc32_lock:
        if _crc32_users == 0:
            _crc32_setting = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        _crc32_users += 1
    try:
        yield
    finally:
        with _crc32_lock:
            _crc32_users -= 1
            if _crc32_users == 0:
                torch.serialization.set_crc32_options(_crc32_setting)


def save_verified(state: dict[str, Any], path: Path) -> str:
    """``torch.save`` ``state`` atomically to ``path`` and write ``<path>.sha256`` beside it; return the digest.

    The SHA-256 is computed while the bytes stream to the file (``_HashingWriter``): no second
    pass over the data, no copy of it in memory. The sidecar is ``<digest>  <name>``, the
    format of ``sha256sum``: ``sha256sum -c`` checks it.
    """
    path = Path(path)
    with _atomic_file(path) as f, _without_crc32():
        writer = _HashingWriter(f)
        try:
            torch.save(state, writer)
        except BaseException:
            writer.finish()
            if writer.error is not None:  # the real cause (a full disk), not torch's "unexpected pos"
                raise writer.error from None
            raise
    digest = writer.hexdigest()
    atomic_write_bytes(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode())
    return digest


def _digest_in_background(fd: int) -> Callable[[], str]:
    """Start hashing the open file ``fd`` in a thread; return a function that waits for the hex digest
    (and raises the ``OSError`` of a file that cannot be read).

    One ``hashlib`` call over a read-only ``mmap`` of the file: the GIL is released for the
    whole file, so the hash never waits for ``torch.load``'s thread, which takes the GIL
    between its reads. The thread hashes its own duplicate of ``fd``.
    """
    fd = os.dup(fd)

    def run() -> str:
        try:
            if os.fstat(fd).st_size == 0:  # mmap refuses an empty file
                return hashlib.sha256().hexdigest()
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as view:
                if hasattr(mmap, "MADV_SEQUENTIAL"):
                    view.madvise(mmap.MADV_SEQUENTIAL)
                return hashlib.sha256(view).hexdigest()
        finally:
            os.close(fd)

    helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-sha256")
    digest = helper.submit(run)
    helper.shutdown(wait=False)  # the thread ends with its one task
    return digest.result


def load_verified(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of ``path``, checked against its SHA-256 sidecar.

    The file is hashed in a second thread while ``torch.load`` reads it (one open file for
    both, so they see the same bytes); when the digest does not match, the loaded state is
    discarded. Raises ``CorruptCheckpointError`` for a missing sidecar, a mismatch, or a file
    ``torch.load`` cannot read. ``weights_only=True`` is what makes reading an unverified file
    safe: it never runs pickled code.
    """
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    try:
        expected = sidecar.read_text().split()[0]
        file = open(path, "rb")
    except (OSError, IndexError) as exc:
        raise CorruptCheckpointError(f"{path.name}: 文件或校验和缺失 ({exc})") from exc
    with file:
        digest = _digest_in_background(file.fileno())
        try:
            state, error = torch.load(file, map_location=map_location, weights_only=True), None
        except Exception as exc:
            state, error = None, exc
    try:
        actual = digest()
    except OSError as exc:
        raise CorruptCheckpointError(f"{path.name}: 无法读取 ({exc})") from exc
    if actual != expected:
        raise CorruptCheckpointError(f"{path.name}: 校验和不符(文件损坏或只写了一半)")
    if error is not None:
        raise CorruptCheckpointError(f"{path.name}: 无法加载 ({type(error).__name__}: {error})") from error
    return state


class CheckpointManager:
    """Rotating, checksummed checkpoints in one folder: ``step_<N>.pt`` plus ``best.pt`` (and ``last_good.pt``).

    Retention after each save: the ``keep_last`` newest ``step_*`` files (the one just written
    counts as one of them; newer files already in the folder are left alone), ``best.pt``,
    ``last_good.pt`` with ``keep_last_good``, and ``protected`` (the file this manager loaded).

    With ``async_save=True``, ``save`` returns once the state is copied to host memory (pinned
    memory for CUDA tensors; the copy is reused by the next save, so the manager keeps one
    state's worth of host memory) and a background thread writes, publishes ``best.pt`` /
    ``last_good.pt`` and prunes. Call ``check()`` in the loop (raises a background error
    without waiting) and ``wait()`` before the process reports that it is done. A kill during
    a background write leaves the previous checkpoints, as a kill during a synchronous one does.
    """

    def __init__(self, directory: str | os.PathLike, keep_last: int = 2, keep_best: bool = True,
                 every_steps: int | None = None, every_seconds: float | None = None, mode: str = "max",
                 keep_last_good: bool = False, async_save: bool = False) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last 至少为 1,实际是 {keep_last}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode 只能是 'max' 或 'min',实际是 {mode!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_last, self.keep_best, self.keep_last_good, self.mode = keep_last, keep_best, keep_last_good, mode
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.best_metric: float | None = None
        self.protected: Path | None = None
        self.corrupt: list[Path] = []  # files the last load_latest skipped
        self._last_save_time = time.monotonic()
        self.async_save = async_save
        self._writer: threading.Thread | None = None  # the save in flight
        self._error: BaseException | None = None  # what it raised, until check()/wait() raises it here
        self._staging: list[torch.UntypedStorage] = []  # host copies of the state's storages, reused

    def checkpoints(self) -> list[Path]:
        """``step_<N>.pt`` files, oldest first."""
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _STEP_FILE.match(p.name))]
        return [p for _, p in sorted(found)]

    def should_save(self, step: int) -> bool:
        """True every ``every_steps`` steps, or once ``every_seconds`` have passed since the last save."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(self.every_seconds) and time.monotonic() - self._last_save_time >= self.every_seconds

    def is_better(self, metric: float) -> bool:
        if self.best_metric is None:
            return True
        return metric > self.best_metric if self.mode == "max" else metric < self.best_metric

    def save(self, state: dict[str, Any], step: int, metric: float | None = None, *, healthy: bool = True) -> Path:
        """Save ``state`` as ``step_<step>.pt``; also as ``best.pt`` if ``metric`` improved, and as
        ``last_good.pt`` if ``healthy`` and ``keep_last_good``; prune old files.

        With ``async_save`` the file is written in the background after this returns (first
        waiting for the previous save, whose error is raised here).
        """
        self.wait()
        improved = metric is not None and self.keep_best and self.is_better(metric)
        if improved:
            self.best_metric = float(metric)
        state = {**state, "best_metric": self.best_metric}
        path = self.directory / f"step_{step:08d}.pt"
        publish = [name for name, wanted in (("best.pt", improved), ("last_good.pt", healthy and self.keep_last_good))
                   if wanted]
        if self.async_save:
            self._writer = threading.Thread(target=self._write_in_background, name=f"checkpoint {path.name}",
                                            args=(self._stage(state), step, path, publish))
            self._writer.start()
        else:
            self._write(state, step, path, publish)
        self._last_save_time = time.monotonic()
        return path

    def _write(self, state: dict[str, Any], step: int, path: Path, publish: list[str]) -> None:
        digest = save_verified(state, path)
        for name in publish:
            self._publish(name, path, digest)
        self._prune(step)

    def _write_in_background(self, *args: Any) -> None:
        try:
            self._write(*args)
        except BaseException as exc:  # raised in the training loop by check()/wait()/the next save
            self._error = exc

    def check(self) -> None:
        """Raise the error of a background save that failed (a full disk...), without waiting; else nothing."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait(self) -> None:
        """Block until the save in flight (``async_save``) is on disk; raise its error if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self.check()

    @property
    def saving(self) -> bool:
        """True while a background save is being written."""
        return self._writer is not None and self._writer.is_alive()

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` whose tensors live in this manager's host buffers, safe to write while training goes on.

        Each storage is copied whole, once, so tensors that share memory still share it and
        the file is what ``torch.save(state)`` would write (CUDA tensors become CPU tensors;
        ``map_location`` on load puts them back). The buffers are reused by the next save when
        the sizes match: a fresh allocation costs page faults, a pinned one much more.
        Other values are deep-copied.
        """
        copies: dict[tuple, torch.UntypedStorage] = {}  # one host copy per source storage
        memo: dict[int, Any] = {}  # copy.deepcopy's memo: each tensor -> its staged view
        gpus = set()
        for tensor in _tensors(state):
            if id(tensor) in memo or not _plain_dense(tensor):
                continue  # seen already, or a sparse/quantized/subclass tensor: deepcopy clones it
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

    def _publish(self, name: str, path: Path, digest: str) -> None:
        """Make ``name`` the same bytes as ``path`` without serialising twice: a hard link
        (no extra disk space) where the file system allows it, a copy otherwise; atomic either way."""
        target = self.directory / name
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            try:
                os.link(path, tmp)
            except OSError:  # no hard links here (some network and FAT file systems)
                shutil.copyfile(path, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        atomic_write_bytes(target.with_name(target.name + ".sha256"), f"{digest}  {target.name}\n".encode())

    def _prune(self, saved_step: int) -> None:
        """Keep the newest ``keep_last`` files up to ``saved_step``; never touch newer files or ``protected``."""
        older = [p for p in self.checkpoints() if int(_STEP_FILE.match(p.name).group(1)) < saved_step]
        for old in older[:max(0, len(older) - (self.keep_last - 1))]:
            if self.protected is not None and old.resolve() == self.protected.resolve():
                continue
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
            old.unlink(missing_ok=True)

    def load_latest(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """The newest checkpoint that passes its checksum as ``(path, state)``, or None.

        Skipped (corrupt) files are warned about and listed in ``corrupt``. The file loaded
        becomes protected: pruning never deletes it.
        """
        self.wait()
        self.corrupt = []
        for path in reversed(self.checkpoints()):
            found = self._load(path, map_location)
            if found is not None:
                return found
        return None

    def load_last_good(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """``last_good.pt`` (the newest checkpoint saved while healthy) as ``(path, state)``, or None."""
        self.wait()
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

    def set_aside(self, after_step: int, also_copy: tuple[Path, ...] = ()) -> list[Path]:
        """Move every checkpoint newer than ``after_step`` out of the way; return where they went.

        Call it once the resume point is chosen. ``step_*`` files above it, and ``best.pt`` /
        ``last_good.pt`` if they hold a later step, belong to no trajectory this run will
        continue: a corrupt file (one ``load_latest`` skipped, or one that cannot be read)
        goes to ``corrupt/``, a valid one (say, the weights after a blow-up) to
        ``superseded/``. Nothing is deleted; a later resume can never pick them up. When
        anything moved, the files in ``also_copy`` (the metrics log that covers them) are
        copied into ``superseded/`` too.
        """
        self.wait()
        moves = [(path, "corrupt" if path in self.corrupt else "superseded") for path in self.checkpoints()
                 if int(_STEP_FILE.match(path.name).group(1)) > after_step]
        for name in ("best.pt", "last_good.pt"):
            path = self.directory / name
            if path.exists():
                step = _peek_step(path)
                if step is None or step > after_step:
                    moves.append((path, "corrupt" if step is None else "superseded"))
        copied = []
        for path in also_copy if moves else ():  # first: a kill between the two steps must not lose the copy
            if path.exists():
                target = self._free_name(self.directory / "superseded", path.name)
                shutil.copyfile(path, target)
                copied.append(target)
        return [self._move(path, kind) for path, kind in moves] + copied

    def last_good_step(self) -> int | None:
        """The step ``last_good.pt`` holds, None if there is none (or it cannot be read)."""
        self.wait()
        path = self.directory / "last_good.pt"
        return _peek_step(path) if path.exists() else None

    @staticmethod
    def _free_name(folder: Path, name: str) -> Path:
        """``folder/name``, or ``folder/<stem>.<n><suffix>`` if taken (folder created if needed)."""
        folder.mkdir(exist_ok=True)
        target, n = folder / name, 1
        while target.exists():
            stem, dot, suffix = name.partition(".")
            target, n = folder / f"{stem}.{n}{dot}{suffix}", n + 1
        return target

    def _move(self, path: Path, kind: str) -> Path:
        target = self._free_name(self.directory / kind, path.name)
        sidecar = path.with_name(path.name + ".sha256")
        if sidecar.exists():
            os.replace(sidecar, target.with_name(target.name + ".sha256"))
        os.replace(path, target)
        return target

    def remove_leftovers(self) -> list[Path]:
        """Delete what a killed save leaves behind: hidden ``.<name>.tmp-<pid>`` files and ``.sha256``
        files whose checkpoint is gone. Call it only while no other process writes here (hold the
        run folder's lock): another writer's temp file looks the same."""
        self.wait()
        removed = []
        for path in self.directory.iterdir():
            orphan = path.name.endswith(".sha256") and not path.with_name(path.name[:-len(".sha256")]).exists()
            if path.is_file() and (_TEMP_FILE.match(path.name) or orphan):
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed


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
                   rng_states: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything needed to continue exactly: the chapter's five elements and the rest.

    Several processes: pass ``rng_states``, every rank's RNG state with rank r's at index r
    (``course_utils.distributed.gather_rng_states()``, on rank 0); the checkpoint then holds
    them all (``"rng_ranks"``). Without it: this process's state, as rank 0 of 1. ``"world_size"``
    records how many processes wrote the checkpoint (absent in older ones: 1).
    A DDP-wrapped ``model`` is saved unwrapped (no ``module.`` prefixes: loads with or without DDP).
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
    return state


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
                           ema: Any = None, restore_rng: bool = True, rank: int = 0) -> dict[str, Any]:
    """Load ``training_state`` output back into live objects; return epoch/step/position/extra.

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
    rng_states = state.get("rng_ranks") or [state["rng"]]
    if restore_rng:
        if not 0 <= rank < len(rng_states):
            raise ValueError(f"检查点只有 {len(rng_states)} 个进程的随机数状态,没有 rank {rank} 的;"
                             "进程数变多时,新 rank 用 seed_rank 另设种子,并传 restore_rng=False")
        set_rng_state(rng_states[rank])
    return {k: state.get(k) for k in ("epoch", "step", "batch_in_epoch", "best_metric", "extra", "config")}
