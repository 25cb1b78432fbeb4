"""Where the Monitor's records go: a JSONL file (always), TensorBoard, wandb, SwanLab, a tqdm bar.

What: each sink takes the records ``course_utils.monitor.Monitor`` computes (one dict per
optimizer step, ``"split": "train"``, or per evaluation, ``"split": "val"``) through
``write(record)``, ``flush()`` and ``close()``. ``read_metrics`` reads ``metrics.jsonl`` back.

Why: a run on a remote machine is seen only through what it wrote. ``metrics.jsonl`` is the
source of truth that code (tests, checks, the next notebook cell) reads back; TensorBoard, wandb
and SwanLab are for people; the bar is for whoever watches the terminal.

Pitfall: a resume. Records (and TensorBoard events) written after the checkpoint a run resumes
from would be written twice, the second time with different values: on resume the JSONL file
is rewritten with the records up to the resumed step only (``durable.atomic_write_text``:
killed at any moment, the folder holds the old file or the new one, both with every record a
checkpoint covers), TensorBoard purges the later events, and wandb continues the same run (its
id is kept in the folder). A torn last line (a kill mid-append) is skipped by ``read_metrics``.
SwanLab (0.10.3) writes one piece (``swanlog/run-<time>-<id>/``) per start under the same run id, and
flushes its file only when the run finishes: a piece killed by ``kill -9`` keeps only what had filled
Python's write buffer (8 KiB: in a short run, nothing). So a resumed ``SwanLabSink`` first replays the records up to the resumed step from
``metrics.jsonl``: the newest piece alone holds the whole run, and is the one to ``swanlab sync``
(its ``--id`` is needed: without it ``swanlab sync`` makes a new run). ``swanlab.init`` also takes
over SIGINT (Ctrl-C would finish the run before the clean stop could save): the sink puts the
handler back.

Paths: each sink takes the run folder (a path or its ``runfolder.RunFiles`` map) and finds its
file there; ``JsonlSink`` takes the file itself.

Example::

    sink = JsonlSink(RunFiles(out).metrics, resume_step=None)
    sink.write({"split": "train", "step": 1, "loss": 2.3})
    sink.close()
    read_metrics(out / "metrics.jsonl")   # [{'split': 'train', 'step': 1, 'loss': 2.3}]

Taught in ``06_monitoring`` §4 (JSONL and TensorBoard read back and compared, wandb and SwanLab offline).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from course_utils.durable import atomic_write_text
from course_utils.runfolder import RunFiles

__all__ = ["read_metrics", "JsonlSink", "TensorBoardSink", "WandbSink", "SwanLabSink", "ProgressSink", "wandb_mode",
           "swanlab_mode", "swanlab_pieces", "read_swanlab"]


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete JSON records of a ``metrics.jsonl`` (a torn last line is ignored)."""
    records = []
    p = Path(path)
    if not p.exists():
        return records
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class JsonlSink:
    """One JSON object per line in ``metrics.jsonl``; on resume, records after the resumed step are dropped."""

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None:
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        elif path.exists():
            path.unlink()
        self._file = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        with self._naming_the_file():
            self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        with self._naming_the_file():
            self._file.flush()

    @contextlib.contextmanager
    def _naming_the_file(self) -> Iterator[None]:
        """A failed write (disk full) names no file by itself: say which one."""
        try:
            yield
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def close(self) -> None:
        self._file.close()


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record, named ``<split>/<field>`` (TensorBoard, wandb and SwanLab tags)."""
    return {f"{record['split']}/{k}": v for k, v in record.items()
            if k not in ("split", "step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardSink:
    """Scalars in the run folder's ``tensorboard/``; on resume, events after the resumed step are purged."""

    def __init__(self, out: str | os.PathLike | RunFiles, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self._writer = SummaryWriter(str(RunFiles.of(out).tensorboard),
                                     purge_step=None if resume_step is None else resume_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        for tag, value in _scalars(record).items():
            self._writer.add_scalar(tag, value, record["step"])

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A wandb run (offline without an account); the run id is kept in the folder so ``--resume`` continues it."""

    def __init__(self, out: str | os.PathLike | RunFiles, project: str, config: dict) -> None:
        self._run = _start_wandb(RunFiles.of(out), project, config)

    def write(self, record: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.log(_scalars(record), step=record["step"])

    def alert(self, title: str, text: str) -> None:
        if self._run is not None:
            with contextlib.suppress(Exception):  # an alert must never stop training
                self._run.alert(title=title, text=text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()


class SwanLabSink:
    """A SwanLab run, offline unless ``SWANLAB_MODE`` says otherwise (``swanlab_mode``); the run id is kept in the
    folder, so ``--resume`` writes a new piece of the same run, the records up to ``resume_step`` replayed first."""

    def __init__(self, out: str | os.PathLike | RunFiles, project: str, config: dict,
                 resume_step: int | None = None) -> None:
        files = RunFiles.of(out)
        self._run = _start_swanlab(files, project, config)
        if self._run is not None and resume_step is not None:
            for record in read_metrics(files.metrics):  # the records every sink got (Monitor._write): train, val
                if record["split"] in ("train", "val") and record["step"] <= resume_step:
                    self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        if self._run is not None:
            with _swanlab_quiet():
                self._run.log(_scalars(record), step=record["step"])

    def flush(self) -> None:
        pass  # swanlab 0.10.3 has no flush: its file is complete once finish() returns

    def close(self) -> None:
        if self._run is not None:
            with _swanlab_quiet():
                self._run.finish()
            self._run = None


class ProgressSink:
    """A tqdm bar: one tick per training record, the latest values as its postfix (``mfu`` too when the record has it)."""

    def __init__(self, total_steps: int | None, resume_step: int | None = None) -> None:
        from tqdm.auto import tqdm
        self._bar = tqdm(total=total_steps, initial=resume_step or 0, unit="step", dynamic_ncols=True)

    def write(self, record: dict[str, Any]) -> None:
        if record["split"] == "train":
            sps = record["samples_per_sec"]
            smooth = record["loss_smooth"]
            self._bar.set_postfix(loss=f"{record['loss']:.3f}", smooth=f"{smooth if smooth is not None else float('nan'):.3f}",
                                  gnorm=f"{record['grad_norm']:.2f}", lr=f"{record['lr']:.2e}",
                                  sps=f"{sps:.0f}" if sps else "-", refresh=False,
                                  **({"mfu": f"{record['mfu']:.1%}"} if record.get("mfu") is not None else {}))
            self._bar.update(1)
        else:
            self._bar.write("eval @ step {}: {}".format(record["step"], ", ".join(
                f"{k}={v:.4f}" for k, v in record.items() if k not in ("split", "step", "epoch"))))

    def print(self, message: str) -> None:
        self._bar.write(message)

    def flush(self) -> None:
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def wandb_mode() -> str:
    """"online" when an API key or a login is configured, else "offline" (logs stay on disk)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    logged_in = netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")
    return "online" if os.environ.get("WANDB_API_KEY") or logged_in else "offline"


def _import_or_skip(name: str, label: str) -> Any:
    """The package ``name``, or None after one line saying that it is missing and how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        print(f"{name} 未安装,跳过 {label} 记录(pip install {name})")
        return None


def _kept_run_id(id_file: Path, new: Callable[[], str]) -> str:
    """The run id a ``--resume`` continues: the one in ``id_file``, else ``new()``, written there."""
    run_id = id_file.read_text().strip() if id_file.exists() else new()
    atomic_write_text(id_file, run_id)
    return run_id


def _start_wandb(files: RunFiles, project: str, config: dict) -> Any:
    wandb = _import_or_skip("wandb", "wandb")
    if wandb is None:
        return None
    run_id = _kept_run_id(files.wandb_id, lambda: uuid.uuid4().hex[:8])
    mode = wandb_mode()
    # silent: wandb's own banner (a dozen "wandb: ..." lines on stderr, pink in Jupyter, like an error)
    # goes to the run's logs/debug.log; this one line says what a learner needs
    run = wandb.init(project=project, dir=str(files.root), id=run_id, resume="allow", mode=mode, config=config,
                     settings=wandb.Settings(silent=True))
    folder = Path(run.dir).parent
    print(f"wandb: {mode} 模式,run 文件夹 {folder.name}(wandb 自己的消息在它的 logs/debug.log)"
          + (";日志在本地,联网后可用 `wandb sync` 上传" if mode == "offline" else ""))
    return run


def swanlab_mode() -> str:
    """``SWANLAB_MODE`` when set ("local": files for ``swanlab watch``, which needs ``swanlab[dashboard]``;
    "online": a login), else "offline": the logs stay in the run folder until ``swanlab sync``. Always a mode:
    ``swanlab.init`` without one and without a login asks on the keyboard (in Jupyter too) and a script hangs."""
    return os.environ.get("SWANLAB_MODE") or "offline"


def swanlab_pieces(out: str | os.PathLike | RunFiles) -> list[Path]:
    """The SwanLab pieces of a run folder, one per start, oldest first (``run-<time>-<id>``: the time sorts them)."""
    return sorted(p for p in RunFiles.of(out).swanlab.glob("run-*") if p.is_dir())


def read_swanlab(piece: str | os.PathLike) -> tuple[str | None, dict[str, dict[int, float]]]:
    """One piece's run id and its scalars (tag -> {step: value}), read from its ``run-<id>.swanlab`` file.

    (None, {}) for a file killed before swanlab wrote its header; a torn record ends the reading (like a torn
    line of ``metrics.jsonl``). Uses swanlab's own reader: the format is versioned with the package.
    """
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader
    path = next(Path(piece).glob("run-*.swanlab"))
    run_id, scalars = None, {}
    if path.stat().st_size < 7:  # the 7-byte header (LEVELDBLOG_HEADER_LEN) is not there yet
        return run_id, scalars
    reader = DataStoreReader()
    reader.open(path)
    with _swanlab_quiet():
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "start":
                run_id = record.start.id
            elif kind == "scalar":
                scalars.setdefault(record.scalar.key, {})[record.scalar.step] = record.scalar.value.number
    reader.close()
    return run_id, scalars


@contextlib.contextmanager
def _swanlab_quiet() -> Iterator[None]:
    """swanlab prints through one rich console (a welcome, where the run was saved, how to sync: in Jupyter a
    block of lines per call): silenced while it runs our call, its warnings still go to the piece's
    ``debug/``. ``init`` and ``finish`` also set SIGINT's handler: the one before the call is put back."""
    from swanlab.sdk.internal.pkg import console
    quiet = console.c.quiet
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    console.c.quiet = True
    try:
        yield
    finally:
        console.c.quiet = quiet
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def _start_swanlab(files: RunFiles, project: str, config: dict) -> Any:
    swanlab = _import_or_skip("swanlab", "SwanLab")
    if swanlab is None:
        return None
    run_id = _kept_run_id(files.swanlab_id, swanlab.utils.generate_id)
    mode = swanlab_mode()
    settings = swanlab.Settings(
        interactive=False,  # never a keyboard prompt: a wrong mode is an error, not a hang
        probe=swanlab.Settings.Probe(requirements=False, monitor=False),  # no `pip list` child, no sampling thread
        terminal=swanlab.Settings.Terminal(proxy_type="none"))  # sys.stdout stays the script's
    with _swanlab_quiet():
        run = swanlab.init(mode=mode, log_dir=str(files.swanlab), project=project, name=files.root.name, id=run_id,
                           resume="allow", config=config, settings=settings)
    how = {"offline": f";联网后上传: swanlab sync --id {run_id} {run.dir}",
           "local": f";本地看板: swanlab watch {files.swanlab}"}.get(mode, "")
    print(f"swanlab: {mode} 模式,run id {run_id},日志在 {run.dir}(swanlab 自己的消息在它的 debug/){how}")
    return run
