"""Monitoring: what to watch while a run trains, written where you can read it later.

What: ``Monitor.log_step`` takes, per optimizer step, the loss, the pre-clip grad norm and
whether clipping fired, the lr and the batch size; it adds the smoothed loss, samples/s and
peak memory, runs the spike alarms (``course_utils.alerts``) and writes one record per step
to its sinks (``course_utils.sinks``: JSONL always, TensorBoard, wandb, SwanLab, a tqdm bar).
``log_eval`` writes an eval record (``"split": "val"``), ``event`` a line of ``"split": "event"``
(a rollback, say) to ``metrics.jsonl`` only. With ``set_mfu(flops_per_sample, peak)`` every timed
train record also carries ``mfu``: model FLOPs per sample × samples/s ÷ the peak (08b §2).
``read_metrics`` reads the file back. The files are the run folder's (``runfolder.RunFiles``).

Why: a run on a remote machine is seen only through its records, and must raise its own
alarm: a loss spike or a grad-norm surge prints a loud line (and a wandb alert), and a bad
step (skipped as non-finite, or a loss spike) is kept in ``trouble`` for ``trouble_window``
steps: ``trouble.count(step)`` is the rate a loop can stop on, ``healthy(step)`` says whether
a checkpoint saved now is a known-good one.

Pitfalls handled:
- ``.item()`` every step forces a GPU sync. Values stay on the device and are read
  back once every ``flush_every`` steps (one sync), so an alarm comes at most
  ``flush_every`` steps late.
- samples/s is measured per flush window, with eval/checkpoint time excluded via
  ``with monitor.paused():`` and the first (warm-up) step left out.
- The smoothed loss is an EMA with ``smoothing=0.98``: it averages about the last
  1/(1 - 0.98) = 50 steps, right for a run of thousands of steps (06 §1 uses 0.9, about
  10 steps, for a 60-step demo). It hides spikes: the raw loss is recorded and alarmed on.
- On resume, records after the resumed step are dropped (``JsonlSink``), so the file holds
  exactly one record per step. Before its detector has enough history, a loss explosion
  (10x above every loss so far) still counts as bad, so a blow-up in the first steps is
  not taken for progress.

Example::

    mon = Monitor(out_dir, loggers=("jsonl", "tensorboard"), total_steps=1000)
    for step in ...:
        mon.log_step(step, epoch, loss, clip.norm, clip.clipped, lr, batch_size)
    with mon.paused():
        mon.log_eval(step, epoch, acc=0.71)
    mon.close()

Taught in ``06_monitoring`` §1 (the same records in plain code) and §4 (the Monitor, its alarms, its loggers).
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from typing import Any, Iterable, Iterator

import torch

from course_utils.alerts import RecentSteps, SpikeDetector
from course_utils.estimate import mfu
from course_utils.runfolder import RunFiles
from course_utils.sinks import JsonlSink, ProgressSink, SwanLabSink, TensorBoardSink, WandbSink, read_metrics

# read_metrics lives beside the writer (sinks); it is named here too because every reader of a run
# folder imports it as course_utils.monitor.read_metrics (CONTRIBUTING "one fact, one place").
__all__ = ["LOGGERS", "Monitor", "peak_memory_mb", "read_metrics"]


LOGGERS = ("jsonl", "tensorboard", "wandb", "swanlab")


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


class Monitor:
    """Computes per-step metrics (smoothing, samples/s, peak memory, spike alarms) and writes them to sinks.

    Values stay on the device until ``flush`` (every ``flush_every`` steps: one host sync).
    Sinks: ``JsonlSink`` always, ``TensorBoardSink`` / ``WandbSink`` / ``SwanLabSink`` as ``loggers`` asks,
    ``ProgressSink`` when ``progress`` is on.
    """

    def __init__(self, out_dir: str | os.PathLike | RunFiles, loggers: Iterable[str] = ("jsonl",), *, flush_every: int = 20,
                 smoothing: float = 0.98, device: torch.device | str = "cpu", total_steps: int | None = None,
                 resume_step: int | None = None, config: dict | None = None, progress: bool = True,
                 project: str = "course-0.4", trouble_window: int = 50) -> None:
        files = RunFiles.of(out_dir)
        self.out = files.root
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
        self.flops_per_sample, self.peak_flops = 0.0, None  # set_mfu
        self.path = files.metrics
        self._jsonl = JsonlSink(self.path, resume_step)
        self.sinks: list[Any] = [self._jsonl]
        if "tensorboard" in self.loggers:
            self.sinks.append(TensorBoardSink(files, resume_step))
        self._wandb = WandbSink(files, project, config or {}) if "wandb" in self.loggers else None
        if self._wandb is not None:
            self.sinks.append(self._wandb)
        if "swanlab" in self.loggers:
            self.sinks.append(SwanLabSink(files, project, config or {}, resume_step))
        self._progress = ProgressSink(total_steps, resume_step) if progress else None
        if self._progress is not None:
            self.sinks.append(self._progress)

    def set_mfu(self, flops_per_sample: float, peak_flops: float | None) -> None:
        """Log ``mfu`` in every timed train record from now on (``peak_flops`` None: no mfu).

        ``flops_per_sample``: forward + backward FLOPs of one sample; ``peak_flops``: FLOP/s of every
        process together (the datasheet's dense number on a GPU; 08b §2 measures it on a CPU).
        """
        self.flops_per_sample, self.peak_flops = flops_per_sample, peak_flops

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
            if sps and self.peak_flops:
                record["mfu"] = mfu(sps * self.flops_per_sample, self.peak_flops)
            if self.loss_alarm.update(loss):
                self.trouble.add(step)
                self.alert("loss spike", f"step {step}: loss {loss:.4g},近期中位数 {_median(self.loss_alarm.history)}", step)
            if self.grad_alarm.update(gnorm):
                self.alert("grad-norm surge", f"step {step}: 裁剪前 grad norm {gnorm:.4g},"
                           f"近期中位数 {_median(self.grad_alarm.history)}", step)
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

    def event(self, record: dict[str, Any]) -> None:
        """An event line (``"split": "event"``) in ``metrics.jsonl`` only, after every step record before it."""
        self.flush()
        self._jsonl.write(record)
        self._jsonl.flush()

    def log_ranks(self, step: int, times: list[dict[str, float]]) -> None:
        """A ``"split": "ranks"`` line in ``metrics.jsonl``: each rank's seconds per step since the last one
        (``course_utils.heartbeat.Heartbeat.take_times``: busy, data, wait, exchanges), rank r's at index r."""
        self.flush()
        self._jsonl.write({"split": "ranks", "step": step, **{k: [round(t[k], 6) for t in times]
                                                              for k in ("busy", "data", "wait", "exchanges")}})

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


def _median(history) -> str:
    """The alarm's recent median for a message; a run whose first losses are NaN has none yet."""
    return f"{statistics.median(history):.4g}" if history else "无(还没有有限值)"
