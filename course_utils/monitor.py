"""Monitoring: what to watch while a run trains, written where you can read it later.

Per optimizer step: loss (raw and smoothed), the pre-clip grad norm and whether
clipping fired, lr, peak memory, samples/s. Eval records carry ``"split": "val"``.
Backends: JSONL (always), TensorBoard, wandb (offline when no account is set up).

Pitfalls handled:
- ``.item()`` every step forces a GPU sync. Values stay on the device and are read
  back once every ``flush_every`` steps (one sync), then written as one record per step.
- samples/s is measured per flush window, with eval/checkpoint time excluded via
  ``with monitor.paused():`` and the first (warm-up) step left out.
- A loss spike or grad-norm surge prints a console alert (and a wandb alert).
- On resume, records after the resumed step are dropped so the file holds exactly
  one record per step. The rewrite is atomic and durable: a kill at any moment keeps
  every record that a checkpoint covers.
- Trouble: a skipped (non-finite) step, or a step the loss spike detector flags, is a
  bad step, kept in ``trouble`` for ``trouble_window`` steps: ``trouble.count(step)`` is
  the rate a training loop can stop on, and ``healthy(step)`` (no bad step in the window)
  says whether a checkpoint saved now is a known-good one. Before its detector has enough
  history, an explosion (10x above every loss so far) still counts, so a blow-up in the
  first steps is not taken for progress.

Example::

    mon = Monitor(out_dir, loggers=("jsonl", "tensorboard"), total_steps=1000)
    for step in ...:
        mon.log_step(step, epoch, loss, clip.norm, clip.clipped, lr, batch_size)
    with mon.paused():
        mon.log_eval(step, epoch, acc=0.71)
    mon.close()

Taught in ``06_monitoring`` §4–5.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

__all__ = ["LOGGERS", "SpikeDetector", "RecentSteps", "peak_memory_mb", "read_metrics", "JsonlSink",
           "TensorBoardSink", "WandbSink", "ProgressSink", "Monitor", "wandb_mode"]


LOGGERS = ("jsonl", "tensorboard", "wandb")


class SpikeDetector:
    """Flags a value far above the recent median: robust to ordinary noise, loud on spikes.

    A value is a spike when it is not finite, or when, after ``warmup`` values, it exceeds
    both ``median + threshold * 1.4826 * MAD`` and ``min_ratio * median`` of the last
    ``window`` values. Before ``warmup`` values there is no noise estimate and no judgement,
    except, with ``explode_ratio``, for a value more than ``explode_ratio`` times every value
    so far (an lr blow-up at step 2 must not wait 20 steps to be noticed).
    """

    def __init__(self, window: int = 50, threshold: float = 6.0, min_ratio: float = 1.5, warmup: int = 20,
                 explode_ratio: float | None = None) -> None:
        self.window, self.threshold, self.min_ratio, self.warmup = window, threshold, min_ratio, warmup
        self.explode_ratio = explode_ratio
        self.history: deque[float] = deque(maxlen=window)

    def update(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        spike = False
        if len(self.history) >= self.warmup:
            med = statistics.median(self.history)
            mad = statistics.median(abs(v - med) for v in self.history)
            spike = value > med + self.threshold * 1.4826 * mad and value > self.min_ratio * med
        elif self.explode_ratio is not None and self.history:
            spike = value > self.explode_ratio * max(self.history)
        self.history.append(value)
        return spike

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state["history"], maxlen=self.window)


class RecentSteps:
    """The marked steps among the last ``window`` steps: a rate, not only a streak.

    "Stop after 5 bad steps in a row" never fires when every other step is bad; "stop when
    5 of the last 50 steps were bad" does. A step marked twice counts once.

    Example::

        bad = RecentSteps(window=50)
        if skipped:
            bad.add(step)
        if bad.count(step) >= 5: ...
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window 至少为 1,实际是 {window}")
        self.window = window
        self.steps: set[int] = set()

    def add(self, step: int) -> None:
        self.steps.add(int(step))

    def count(self, step: int) -> int:
        """How many marked steps lie in ``(step - window, step]``. Marks older than that window are
        forgotten, so ask with non-decreasing steps (a training loop does)."""
        self.steps = {s for s in self.steps if s > step - self.window}
        return sum(1 for s in self.steps if s <= step)

    def state_dict(self) -> dict:
        return {"window": self.window, "steps": sorted(self.steps)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = {int(s) for s in state["steps"]}


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's peak on GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)
    except ImportError:  # Windows
        import psutil
        return psutil.Process().memory_info().peak_wset / 2**20


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
    """One JSON object per line in ``metrics.jsonl``; on resume, records after the resumed step are dropped.

    The rewrite goes through a temp file, ``fsync`` and ``os.replace``: killed at any moment,
    the folder holds the old file or the new one, both with every record up to ``resume_step``.
    """

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None:
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in kept))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
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
    """Scalars under ``out/tensorboard``; on resume, events after the resumed step are purged."""

    def __init__(self, out: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self._writer = SummaryWriter(str(out / "tensorboard"),
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

    def __init__(self, out: Path, project: str, config: dict) -> None:
        self._run = _start_wandb(out, project, config)

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
    """A tqdm bar: one tick per training record, the latest values as its postfix."""

    def __init__(self, total_steps: int | None, resume_step: int | None = None) -> None:
        from tqdm.auto import tqdm
        self._bar = tqdm(total=total_steps, initial=resume_step or 0, unit="step", dynamic_ncols=True)

    def write(self, record: dict[str, Any]) -> None:
        if record["split"] == "train":
            sps = record["samples_per_sec"]
            smooth = record["loss_smooth"]
            self._bar.set_postfix(loss=f"{record['loss']:.3f}", smooth=f"{smooth if smooth is not None else float('nan'):.3f}",
                                  gnorm=f"{record['grad_norm']:.2f}", lr=f"{record['lr']:.2e}",
                                  sps=f"{sps:.0f}" if sps else "-", refresh=False)
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


class Monitor:
    """Computes per-step metrics (smoothing, samples/s, peak memory, spike alarms) and writes them to sinks.

    Values stay on the device until ``flush`` (every ``flush_every`` steps: one host sync).
    Sinks: ``JsonlSink`` always, ``TensorBoardSink`` / ``WandbSink`` as ``loggers`` asks,
    ``ProgressSink`` when ``progress`` is on.
    """

    def __init__(self, out_dir: str | os.PathLike, loggers: Iterable[str] = ("jsonl",), *, flush_every: int = 20,
                 smoothing: float = 0.98, device: torch.device | str = "cpu", total_steps: int | None = None,
                 resume_step: int | None = None, config: dict | None = None, progress: bool = True,
                 project: str = "course-0.4", trouble_window: int = 50) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.loggers = tuple(dict.fromkeys(["jsonl", *loggers]))
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(f"未知的 logger {unknown};可选: {', '.join(LOGGERS)}")
        self.flush_every, self.smoothing = flush_every, smoothing
        self.device = torch.device(device)
        self.smooth: float | None = None
        self.smooth_n = 0
        self.loss_alarm, self.grad_alarm = SpikeDetector(explode_ratio=10.0), SpikeDetector()
        self.trouble = RecentSteps(trouble_window)  # bad steps: skipped (non-finite) or loss spikes
        self.alerts: list[dict[str, Any]] = []
        self._pending: list[tuple] = []
        self._window_start: float | None = None
        self._window_samples = 0
        self._paused = 0.0
        self.path = self.out / "metrics.jsonl"
        self.sinks: list[Any] = [JsonlSink(self.path, resume_step)]
        if "tensorboard" in self.loggers:
            self.sinks.append(TensorBoardSink(self.out, resume_step))
        self._wandb = WandbSink(self.out, project, config or {}) if "wandb" in self.loggers else None
        if self._wandb is not None:
            self.sinks.append(self._wandb)
        self._progress = ProgressSink(total_steps, resume_step) if progress else None
        if self._progress is not None:
            self.sinks.append(self._progress)

    def log_step(self, step: int, epoch: int, loss: torch.Tensor, grad_norm: torch.Tensor,
                 clipped: torch.Tensor | bool, lr: float, batch_size: int, skipped: bool = False) -> None:
        """Record one optimizer step. Tensors stay on the device until the next flush."""
        now = time.perf_counter()
        if self._window_start is None:       # first step after (re)start: warm-up, not timed
            self._window_start, self._paused = now, 0.0
        else:
            self._window_samples += batch_size
        if skipped:  # known now; loss spikes are judged at the next flush
            self.trouble.add(step)
        as_t = lambda v: v.detach().float().reshape(()) if torch.is_tensor(v) else torch.tensor(float(v))  # noqa: E731
        self._pending.append((step, epoch, as_t(loss), as_t(grad_norm), as_t(clipped), float(lr), skipped))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> list[dict[str, Any]]:
        """Read pending values back (one sync), write one record per step, check alarms."""
        if not self._pending:
            return []
        values = torch.stack([torch.stack([p[2].cpu(), p[3].cpu(), p[4].cpu()]) for p in self._pending]).tolist()
        now = time.perf_counter()
        elapsed = now - (self._window_start or now) - self._paused
        sps = self._window_samples / elapsed if elapsed > 0 and self._window_samples else None
        self._window_start, self._window_samples, self._paused = now, 0, 0.0
        mem = peak_memory_mb(self.device)
        records = []
        for (step, epoch, _, _, _, lr, skipped), (loss, gnorm, clipped) in zip(self._pending, values):
            if math.isfinite(loss) and not skipped:
                self.smooth_n += 1
                self.smooth = loss if self.smooth is None else self.smoothing * self.smooth + (1 - self.smoothing) * loss
            record = {"split": "train", "step": step, "epoch": epoch, "loss": loss, "loss_smooth": self.smooth,
                      "grad_norm": gnorm, "clipped": bool(clipped), "lr": lr, "samples_per_sec": sps,
                      "mem_peak_mb": mem, "skipped": skipped}
            if self.loss_alarm.update(loss):
                self.trouble.add(step)
                self.alert("loss spike", f"step {step}: loss {loss:.4g},近期中位数 "
                           f"{statistics.median(self.loss_alarm.history):.4g}", step)
            if self.grad_alarm.update(gnorm):
                self.alert("grad-norm surge", f"step {step}: 裁剪前 grad norm {gnorm:.4g},近期中位数 "
                           f"{statistics.median(self.grad_alarm.history):.4g}", step)
            records.append(record)
            self._write(record)
        self._pending.clear()
        self._flush_sinks()
        return records

    def _write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def _flush_sinks(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def log_eval(self, step: int, epoch: int, **metrics: float) -> dict[str, Any]:
        """Write an eval record (``"split": "val"``) right away."""
        self.flush()
        record = {"split": "val", "step": step, "epoch": epoch, **{k: float(v) for k, v in metrics.items()}}
        self._write(record)
        self._flush_sinks()
        return record

    def alert(self, title: str, text: str, step: int | None = None) -> None:
        """A loud console line, remembered in ``alerts``, and a wandb alert when wandb is on."""
        self.alerts.append({"title": title, "text": text, "step": step})
        message = f"⚠️  [ALERT] {title}: {text}"
        (self._progress.print if self._progress is not None else print)(message)
        if self._wandb is not None:
            self._wandb.alert(title, text)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Exclude the time spent inside (eval, checkpointing) from samples/s."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start

    def healthy(self, step: int) -> bool:
        """No bad step (skipped, or a loss spike) in the last ``trouble_window`` steps up to ``step``.
        Spikes are judged at flush time: ``flush()`` first."""
        return self.trouble.count(step) == 0

    def state_dict(self) -> dict[str, Any]:
        return {"smooth": self.smooth, "smooth_n": self.smooth_n, "loss_alarm": self.loss_alarm.state_dict(),
                "grad_alarm": self.grad_alarm.state_dict(), "trouble": self.trouble.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.smooth, self.smooth_n = state["smooth"], state["smooth_n"]
        self.loss_alarm.load_state_dict(state["loss_alarm"])
        self.grad_alarm.load_state_dict(state["grad_alarm"])
        if "trouble" in state:  # checkpoints written before trouble tracking have none
            self.trouble.load_state_dict(state["trouble"])

    def close(self) -> None:
        self.flush()
        for sink in self.sinks:
            sink.close()


def wandb_mode() -> str:
    """"online" when an API key or a login is configured, else "offline" (logs stay on disk)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    logged_in = netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")
    return "online" if os.environ.get("WANDB_API_KEY") or logged_in else "offline"


def _start_wandb(out: Path, project: str, config: dict) -> Any:
    try:
        import wandb
    except ImportError:
        print("wandb 未安装,跳过 wandb 记录(pip install wandb)")
        return None
    id_file = out / "wandb_run_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]  # reused on --resume
    id_file.write_text(run_id)
    mode = wandb_mode()
    run = wandb.init(project=project, dir=str(out), id=run_id, resume="allow", mode=mode, config=config)
    print(f"wandb: {mode} 模式" + (",日志在本地,联网后可用 `wandb sync` 上传" if mode == "offline" else ""))
    return run
