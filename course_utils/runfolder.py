"""One run per folder: a lock, a status file, the saved config as the run's identity, no leftovers.

A run folder (``--out``) holds exactly one training run: ``config.json`` (what the run
is), ``metrics.jsonl``, ``checkpoints/``, ``status.json`` (how it ended) and ``run.lock``.
``RunFiles`` is the folder's file map, the one place that names those files (and the rest:
the skipped batches, the sample ledger, TensorBoard's folder); every writer takes its path from
it, and ``RunFolder.claim`` hands out the map with the lock. Ranks above 0 of a torchrun job
claim nothing: ``RunFiles.read_only(out)`` gives them the same map, to read checkpoints.
What goes wrong without the rules below is what people actually do:

- two runs started with the same ``--out`` both train and interleave their files.
  ``RunFolder.claim`` takes a ``fcntl.lockf`` lock; a second process is refused with the
  first one's pid. Not ``flock``: a ``flock`` lock belongs to the open file, so forked
  DataLoader workers inherit it and keep it after the trainer is killed, and an immediate
  restart would be refused. A ``lockf`` (POSIX record) lock belongs to the process and
  dies with it;
- forgetting ``--resume`` in a finished folder overwrites the old run's config and
  metrics. ``claim`` refuses to start a new run in a folder that holds one unless asked to
  start over (``overwrite=True``), which moves the old run aside instead of deleting it;
- ``--resume`` with a different batch size, seed or data fraction silently continues as a
  different run (or, with a larger batch, spins forever past the end of the epoch).
  ``config_changes`` compares the saved config with the command line and refuses, field by
  field, whatever would change the trajectory; some fields may change only when named;
- launchers (torchrun, some schedulers) fold a worker's exit code into 1, so "preempted"
  and "crashed" look alike. ``status.json`` is the source of truth; ``ExitCode`` is the
  single-process exit status that matches it;
- a process killed while writing leaves a hidden temp file (``.<name>.tmp-<pid>``, see
  ``course_utils.durable``); ``remove_leftovers`` deletes them once the folder is claimed.
  ``status.json`` and ``config.json`` are written with ``durable.atomic_write_json``, each by one
  function: ``RunFolder.write_status`` and ``write_config`` (``repro.dump_run_config`` and
  ``RunFolder.record_changes`` call it).

Only the standard library is imported here (and ``durable``, which imports only it): a script
can claim its folder and check its config in milliseconds, before it imports torch. Under torchrun only rank 0 claims the
folder and writes ``status.json`` and ``config.json`` (``course_utils.distributed.World``
tells a process its rank before torch is imported); the other ranks write nothing.

Example::

    with RunFolder.claim(out, resume=args.resume, overwrite=args.overwrite) as run:
        run.remove_leftovers(manager)       # and a CheckpointManager's; run.files.metrics ...: the paths
        saved = run.saved_config()
        if args.resume and saved:
            changes = config_changes(saved["hparams"], vars(args), free=FREE, changeable={"lr"},
                                     allowed=set(args.allow_change))
        run.write_status("running", step=0)
        ...
        run.write_status("finished", step=total_steps, exit_code=ExitCode.FINISHED)

The clean stop on SIGTERM / Ctrl-C that ends in "preempted" is ``course_utils.signals``.

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (no notebook calls it): its run folder's
file map (``RunFiles``), the one writer of ``config.json`` (``write_config``), the lock, ``status.json``
and the exit codes. 04 §3, 11 §9 and 12 §5 run the script and read what it writes here.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable, Iterable

from course_utils.durable import TEMP_FILE, atomic_write_json

__all__ = ["ExitCode", "STATES", "SKIPPED_FILE", "Refused", "RunFiles", "RunFolder", "read_status", "holds_run", "config_changes",
           "write_config"]


class ExitCode(IntEnum):
    """The exit status of a single-process run; ``status.json`` says the same in words."""

    FINISHED = 0    # every step done
    FAILED = 1      # an error (data, disk, a bug); the message names the cause
    REFUSED = 2     # bad command line or a folder conflict; nothing was changed (argparse's convention)
    BAD_STEPS = 3   # stopped: too many bad steps (inf/NaN, loss spikes); --resume goes back to the last known-good one
    PREEMPTED = 75  # SIGTERM/SIGINT: saved and stopped; run again with --resume (75 = EX_TEMPFAIL, "try again")
    HUNG = 124      # no progress for --hang-timeout s (course_utils.heartbeat); --resume continues (124: timeout(1)'s)


# status.json "state" for each way a run ends, plus "running" while it runs
STATES = {ExitCode.FINISHED: "finished", ExitCode.FAILED: "failed", ExitCode.BAD_STEPS: "stopped_bad_steps",
          ExitCode.PREEMPTED: "preempted", ExitCode.HUNG: "hung"}

SKIPPED_FILE = "skipped_batches.json"  # every rollback and the samples of every batch it skipped (course_utils.rollback)


@dataclass(frozen=True)
class RunFiles:
    """Where each file of a run folder lives: the only place their names are written down.

    ``writable`` is False in the view of a rank above 0 (``read_only``): it reads checkpoints and
    writes nothing (the script's writers take a ``RunFiles`` only on rank 0).
    """

    root: Path
    writable: bool = True

    @classmethod
    def of(cls, folder: "str | os.PathLike | RunFiles") -> "RunFiles":
        """The map of ``folder`` (a path, or already a map)."""
        return folder if isinstance(folder, RunFiles) else cls(Path(folder))

    @classmethod
    def read_only(cls, folder: str | os.PathLike) -> "RunFiles":
        return cls(Path(folder), writable=False)

    lock = property(lambda self: self.root / "run.lock", doc="the lock (``fcntl.lockf``) and its holder's pid")
    status = property(lambda self: self.root / "status.json", doc="how the run ended (``RunFolder.write_status``)")
    config = property(lambda self: self.root / "config.json", doc="the run's identity (``write_config``)")
    metrics = property(lambda self: self.root / "metrics.jsonl", doc="one record per step (``sinks.JsonlSink``)")
    checkpoints = property(lambda self: self.root / "checkpoints", doc="``CheckpointManager``'s folder")
    skipped = property(lambda self: self.root / SKIPPED_FILE, doc="what the rollbacks skipped")
    ledger = property(lambda self: self.root / "sample_ledger.jsonl", doc="tests: the samples of every step")
    tensorboard = property(lambda self: self.root / "tensorboard", doc="``sinks.TensorBoardSink``'s events")
    wandb_id = property(lambda self: self.root / "wandb_run_id.txt", doc="the wandb run a resume continues")
    swanlab = property(lambda self: self.root / "swanlog", doc="``sinks.SwanLabSink``'s logs, one piece per start")
    swanlab_id = property(lambda self: self.root / "swanlab_run_id.txt", doc="the SwanLab run a resume continues")
    # the two exceptions to "ranks above 0 write nothing" (course_utils.heartbeat): each rank's own files
    heartbeats = property(lambda self: self.root / "heartbeats", doc="one file per rank while the run lives")
    hangs = property(lambda self: self.root / "hangs", doc="one folder per hang: report.json, every live rank's stacks")


def write_config(folder: "str | os.PathLike | RunFiles", config: dict[str, Any]) -> None:
    """Write ``config.json`` atomically and durably: its only writer (the folder is created if needed)."""
    files = RunFiles.of(folder)
    files.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(files.config, config)


class Refused(Exception):
    """The run cannot start as asked. The message is one Chinese line; nothing on disk was changed."""


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def holds_run(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds a run that made progress: a checkpoint or a metrics record.

    A start that failed before its first step (bad data, a typo caught late) leaves only
    ``config.json``/``status.json``; that is not a run worth protecting.
    """
    files = RunFiles.of(folder)
    return (files.metrics.is_file() and files.metrics.stat().st_size > 0) or any(files.checkpoints.glob("*.pt"))


def _try_lock(path: Path) -> int | None:
    """Open ``path`` and take an exclusive ``lockf`` lock on it: the fd, or None if another process holds it."""
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _holder(folder: Path) -> str:
    try:
        return RunFiles(folder).lock.read_text().strip() or "pid 未知"
    except OSError:
        return "pid 未知"


class RunFolder:
    """A run folder claimed by this process (use ``RunFolder.claim``); the lock is held until ``release``.

    Never open ``run.lock`` a second time in the process that holds the lock: closing any
    descriptor of that file drops a POSIX lock.
    """

    def __init__(self, path: Path, fd: int, moved_aside: Path | None = None) -> None:
        self.path, self._fd, self.moved_aside = path, fd, moved_aside
        self.files = RunFiles(path)  # the file map: every path of the run comes from here
        self.history: list[dict[str, Any]] = []  # status.json's "history" (a rollback's entries), in every write
        self.config: dict[str, Any] | None = None  # the run's identity as config.json holds it (set by its writer)

    @classmethod
    def claim(cls, path: str | os.PathLike, *, resume: bool, overwrite: bool = False) -> "RunFolder":
        """Lock ``path`` (created if needed) for this process; raise ``Refused`` when that is not safe.

        Refused: another process holds the folder; or it holds a run, ``resume`` is False and
        ``overwrite`` is False. With ``overwrite`` an existing run is renamed to
        ``<name>.replaced-<time>`` beside it (nothing is deleted) and a fresh folder is claimed.
        """
        path = Path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = _try_lock(RunFiles(path).lock)
        except OSError as exc:
            raise Refused(f"无法在 {path} 建立运行目录: {exc.strerror or exc}") from None
        if fd is None:
            raise Refused(f"{path} 正被另一个训练进程使用({_holder(path)});同一个 --out 同时只能跑一个运行") from None
        folder = cls(path, fd)
        folder._write_holder()
        if resume or not holds_run(path):
            return folder
        if not overwrite:
            status = read_status(path, check_alive=False) or {}
            state = f"状态 {status['state']},step {status.get('step')}" if status.get("state") else "有检查点/记录"
            folder.release()
            raise Refused(f"{path} 里已经有一次运行({state});继续它请加 --resume,"
                          "从头重来请加 --overwrite(旧运行会被改名保留,不会删除)")
        aside = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while aside.exists():
            aside, n = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
        try:
            os.rename(path, aside)
            path.mkdir()
            fresh = _try_lock(RunFiles(path).lock)
        except OSError as exc:
            folder.release()
            raise Refused(f"--overwrite: 无法把旧运行移到 {aside}: {exc.strerror or exc}") from None
        folder.release()  # the lock of the old folder, now at `aside`
        if fresh is None:
            raise Refused(f"{path} 刚被另一个训练进程占用({_holder(path)})") from None
        folder = cls(path, fresh, moved_aside=aside)
        folder._write_holder()
        return folder

    def remove_leftovers(self, *also: Any) -> list[Path]:
        """Delete the hidden ``.<name>.tmp-<pid>`` files (``durable.TEMP_FILE``) a killed process left in the
        folder, then what the ``remove_leftovers`` of each of ``also`` deletes (a ``CheckpointManager``'s: a killed
        save's temp files and orphan checksums); we hold the lock, so no other writer is at work. Says how many."""
        removed = [p for p in self.path.iterdir() if TEMP_FILE.match(p.name) and p.is_file()]
        for path in removed:
            path.unlink(missing_ok=True)
        removed += [path for other in also for path in other.remove_leftovers()]
        if removed:
            print(f"清理了上次中断留下的 {len(removed)} 个临时文件/孤立校验和")
        return removed

    def _write_holder(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} @ {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        """Drop the lock (also dropped by the OS when the process dies, however it dies)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # ---------------------------------------------------------------- status
    def write_status(self, state: str, step: int, *, exit_code: int | None = None, message: str = "",
                     **extra: Any) -> None:
        """Write ``status.json`` atomically: ``state`` is "running" or one of ``STATES``' values; ``history``
        (when not empty) too."""
        if state != "running" and state not in STATES.values():
            raise ValueError(f"未知的状态 {state!r}")
        atomic_write_json(self.files.status, {"state": state, "step": step, "exit_code": exit_code, "message": message,
                                         "pid": os.getpid(), "host": socket.gethostname(), "updated_at": _now(),
                                         **extra, **({"history": self.history} if self.history else {})})

    def running(self, step: int, **extra: Any) -> None:
        """``status.json`` says "running" at ``step`` (a run that starts, or goes on after a rollback)."""
        self.write_status("running", step, **extra)

    def ended(self, exit_code: ExitCode, step: int, message: str, **extra: Any) -> None:
        """``status.json`` for a run that ended with ``exit_code``: its state in words (``STATES``), the code and
        a one-line ``message``; a hang's watchdog, a failure and every other way out write it through here."""
        self.write_status(STATES[exit_code], step, exit_code=int(exit_code), message=message, **extra)

    def failed(self, message: str, newest_step: int | None) -> None:
        """What went wrong and what is still safe (``newest_step``: the newest checkpoint's, None: none), in one line
        on stderr, and status.json "failed" (unless the disk refuses even that small file)."""
        safe = ("还没有检查点" if newest_step is None else
                f"磁盘上已有的检查点不受影响(最新: step {newest_step}),排除问题后用 --resume 继续")
        print(f"失败: {message}。{safe}", file=sys.stderr)
        try:
            self.ended(ExitCode.FAILED, newest_step or 0, f"{message}。{safe}")
        except OSError as exc:
            print(f"(status.json 也无法写入: {exc.strerror})", file=sys.stderr)

    def choose_checkpoint(self, manager: Any, map_location: Any, check: Callable[[dict, str], None]) -> Any:
        """A --resume's start (rank 0): ``manager``'s newest valid checkpoint, or after a stop on bad steps its
        ``last_good.pt``; ``check(hparams, file name)`` raises ``Refused`` for another run's; newer files are set
        aside (corrupt, or an abandoned trajectory), with a copy of the metrics. None: start from step 0."""
        if (read_status(self.files, check_alive=False) or {}).get("state") == STATES[ExitCode.BAD_STEPS]:
            found = manager.load_last_good(map_location=map_location)
            print("上次因坏步停止: 从最后一个健康的检查点 last_good.pt 继续" if found else
                  "上次因坏步停止,且没有健康的检查点: 从 step 0 重新开始")
        else:
            found = manager.load_latest(map_location=map_location)
        if found is not None and "hparams" in found.state["config"]:  # the checkpoint must be this run's
            check(found.state["config"]["hparams"], found.path.name)
        resume_from = found.state["step"] if found else 0
        aside = manager.set_aside(resume_from, also_copy=(self.files.metrics,))
        if aside:
            print(f"step {resume_from} 之后的文件不属于续训的轨迹,已移走(没有删除): "
                  + ", ".join(str(p.relative_to(self.files.root)) for p in aside))
        if found is None:
            print(f"--resume: {manager.directory} 里没有可用的检查点,从 step 0 开始")
        return found

    # ---------------------------------------------------------------- identity
    def saved_config(self) -> dict[str, Any] | None:
        """``config.json`` as a dict, None if there is none; ``Refused`` if it cannot be read."""
        path = self.files.config
        if not path.exists():
            return None
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(config.get("hparams"), dict):
                raise ValueError("没有 hparams")
        except (OSError, ValueError) as exc:
            raise Refused(f"{path} 无法读取({exc});它是这次运行的身份,请恢复它或用新的 --out") from None
        return config

    def record_changes(self, config: dict[str, Any], changes: dict[str, tuple[Any, Any]], step: int) -> dict[str, Any]:
        """Apply allowed ``changes`` ({field: (old, new)}) to ``config``, append them to its ``history``
        and write ``config.json``; return the new config."""
        config = {**config, "hparams": {**config["hparams"], **{k: new for k, (_, new) in changes.items()}}}
        if changes:
            entry = {"step": step, "changes": {k: [old, new] for k, (old, new) in changes.items()}, "at": _now()}
            config["history"] = [*config.get("history", []), entry]
        write_config(self.files, config)
        return config


def read_status(folder: str | os.PathLike, check_alive: bool = True) -> dict[str, Any] | None:
    """``status.json`` of ``folder`` (None if absent), for launchers, tests and people.

    With ``check_alive``, ``alive`` says whether a process holds the folder's lock; a
    "running" status with ``alive`` False means the run was killed (SIGKILL, OOM, power).
    Do not call this with ``check_alive`` in the process that holds the lock (see ``RunFolder``).
    """
    files = RunFiles.of(folder)
    try:
        status = json.loads(files.status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if check_alive:
        fd = _try_lock(files.lock) if files.lock.exists() else None
        status["alive"] = files.lock.exists() and fd is None
        if fd is not None:
            os.close(fd)
    return status


_MISSING = object()


def config_changes(saved: dict[str, Any], new: dict[str, Any], *, free: Iterable[str], changeable: Iterable[str],
                   allowed: Iterable[str], defaults: dict[str, Any] | None = None,
                   saved_as: str = "这次运行保存的配置") -> dict[str, tuple[Any, Any]]:
    """Compare a run's saved hyperparameters with the command line of a resume.

    ``free`` fields may differ silently (logging, checkpoint interval, workers...).
    ``changeable`` fields may differ only if named in ``allowed`` (``--allow-change``).
    Every other difference is refused: ``Refused`` names each field, old → new.
    A field missing from ``saved`` (a flag added after the run started) is compared with
    ``defaults``. ``saved_as`` names ``saved`` in the message. Returns the allowed changes
    as ``{field: (old, new)}``.
    """
    free, changeable, allowed = set(free), set(changeable), set(allowed)
    defaults = defaults or {}
    changed = {}
    for key, value in new.items():
        old = saved.get(key, defaults.get(key, _MISSING))
        if key not in free and _normal(old) != _normal(value):
            changed[key] = (None if old is _MISSING else old, value)
    refused = [f"{k} {_show(old)} → {_show(new)}" + (f"(确要修改请加 --allow-change {k})" if k in changeable else "")
               for k, (old, new) in changed.items() if k not in changeable or k not in allowed]
    if refused:
        raise Refused(f"--resume 被拒绝,命令行与{saved_as}不一致: " + "; ".join(refused)
                      + "。这些设置决定训练轨迹;换设置请用新的 --out,或加 --overwrite 重新开始")
    return changed


def _normal(value: Any) -> Any:
    """Values as JSON keeps them (tuples become lists, paths strings), so saved and new compare equal."""
    return json.loads(json.dumps(value, default=str))


def _show(value: Any) -> str:
    return "(未设置)" if value is None else json.dumps(value, ensure_ascii=False, default=str)

