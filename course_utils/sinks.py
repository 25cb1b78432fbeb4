"""Where the Monitor's records go: a JSONL file (always), TensorBoard, wandb, a tqdm bar.

What: each sink takes the records ``course_utils.monitor.Monitor`` computes (one dict per
optimizer step, ``"split": "train"``, or per evaluation, ``"split": "val"``) through
``write(record)``, ``flush()`` and ``close()``. ``read_metrics`` reads ``metrics.jsonl`` back.

Why: a run on a remote machine is seen only through what it wrote. ``metrics.jsonl`` is the
source of truth that code (tests, checks, the next notebook cell) reads back; TensorBoard and
wandb are for people; the bar is for whoever watches the terminal.

Pitfall: a resume. Records (and TensorBoard events) written after the checkpoint a run resumes
from would be written twice, the second time with different values: on resume the JSONL file
is rewritten with the records up to the resumed step only (``durable.atomic_write_text``:
killed at any moment, the folder holds the old file or the new one, both with every record a
checkpoint covers), TensorBoard purges the later events, and wandb continues the same run (its
id is kept in the folder). A torn last line (a kill mid-append) is skipped by ``read_metrics``.

Paths: each sink takes the run folder (a path or its ``runfolder.RunFiles`` map) and finds its
file there; ``JsonlSink`` takes the file itself.

Example::

    sink = JsonlSink(RunFiles(out).metrics, resume_step=None)
    sink.write({"split": "train", "step": 1, "loss": 2.3})
    sink.close()
    read_metrics(out / "metrics.jsonl")   # [{'split': 'train', 'step': 1, 'loss': 2.3}]

Taught in ``06_monitoring`` §4 (JSONL and TensorBoard read back and compared, wandb offline).
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

from course_utils.durable import atomic_write_text
from course_utils.runfolder import RunFiles

__all__ = ["read_metrics", "JsonlSink", "TensorBoardSink", "WandbSink", "ProgressSink", "wandb_mode"]


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
    """The numeric fields of a record, named ``<split>/<field>`` (TensorBoard and wandb tags)."""
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


def _start_wandb(files: RunFiles, project: str, config: dict) -> Any:
    try:
        import wandb
    except ImportError:
        print("wandb 未安装,跳过 wandb 记录(pip install wandb)")
        return None
    id_file = files.wandb_id
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]  # reused on --resume
    atomic_write_text(id_file, run_id)
    mode = wandb_mode()
    # silent: wandb's own banner (a dozen "wandb: ..." lines on stderr, pink in Jupyter, like an error)
    # goes to the run's logs/debug.log; this one line says what a learner needs
    run = wandb.init(project=project, dir=str(files.root), id=run_id, resume="allow", mode=mode, config=config,
                     settings=wandb.Settings(silent=True))
    folder = Path(run.dir).parent
    print(f"wandb: {mode} 模式,run 文件夹 {folder.name}(wandb 自己的消息在它的 logs/debug.log)"
          + (";日志在本地,联网后可用 `wandb sync` 上传" if mode == "offline" else ""))
    return run
