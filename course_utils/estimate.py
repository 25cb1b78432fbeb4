"""Training-time and cost estimates from measured throughput (do this before renting a GPU).

    total_hours = samples * epochs / (batch_size * steps_per_sec * 3600)

The chapter's example: 10,000 samples, 3 epochs, batch 4, 0.5 steps/s -> ~4.2 h.
Unit trap: the formula wants STEPS per second. If 0.5 is really samples per second
(0.125 steps/s at batch 4), the run takes four times longer, ~16.7 h.

Example::

    tp = measure_throughput(lambda: train_step(next(batches)), batch_size=128, steps=50, warmup=5)
    est = estimate_training_time(50_000, epochs=30, batch_size=128, steps_per_sec=tp.steps_per_sec,
                                 price_per_hour=2.4)
    print(est.summary())

Taught in ``08_time_estimate`` §1–3.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Throughput", "measure_throughput", "training_hours", "Estimate", "estimate_training_time"]


@dataclass
class Throughput:
    steps: int
    seconds: float
    batch_size: int

    @property
    def steps_per_sec(self) -> float:
        return self.steps / self.seconds

    @property
    def samples_per_sec(self) -> float:
        return self.steps * self.batch_size / self.seconds


def measure_throughput(step_fn: Callable[[], object], batch_size: int, steps: int = 50, warmup: int = 5,
                       device: torch.device | None = None) -> Throughput:
    """Run ``warmup`` untimed steps, then time ``steps`` steps (synchronising the GPU around them)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device is not None and device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step_fn()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step_fn()
    sync()
    return Throughput(steps=steps, seconds=time.perf_counter() - start, batch_size=batch_size)


def training_hours(num_samples: float, epochs: float, batch_size: int, steps_per_sec: float) -> float:
    """Hours of a run: ``num_samples * epochs / batch_size`` optimizer steps at ``steps_per_sec``.

    The one place the formula is written; everything else (``estimate_training_time``,
    the notebook checks) calls it. ``steps_per_sec`` counts optimizer steps, not samples.
    """
    return num_samples * epochs / (batch_size * steps_per_sec * 3600)


@dataclass
class Estimate:
    total_steps: int
    hours: float
    cost: float | None
    steps_per_sec: float
    note: str = ""

    def summary(self) -> str:
        text = f"{self.total_steps} 步 ÷ {self.steps_per_sec:.4g} 步/秒 ≈ {self.hours:.2f} 小时"
        if self.cost is not None:
            text += f",约 {self.cost:.1f} 元"
        return text + (f"\n{self.note}" if self.note else "")


def estimate_training_time(num_samples: int, epochs: float, batch_size: int, *, steps_per_sec: float | None = None,
                           samples_per_sec: float | None = None, price_per_hour: float | None = None,
                           verbose: bool = True) -> Estimate:
    """Hours (and cost) of a run, from a measured throughput given in exactly one unit.

    Pass ``steps_per_sec`` (optimizer steps, each ``batch_size`` samples) or
    ``samples_per_sec``; giving samples/s prints a warning that spells out the unit trap.
    """
    if (steps_per_sec is None) == (samples_per_sec is None):
        raise ValueError("请只给出 steps_per_sec 或 samples_per_sec 其中一个(吞吐单位必须明确)")
    if num_samples <= 0 or epochs <= 0 or batch_size <= 0:
        raise ValueError(f"样本数/epoch/batch 应为正数,实际是 {num_samples}/{epochs}/{batch_size}")
    note = ""
    if samples_per_sec is not None:
        if samples_per_sec <= 0:
            raise ValueError(f"吞吐应为正数,实际是 {samples_per_sec}")
        steps_per_sec = samples_per_sec / batch_size
        wrong_hours = training_hours(num_samples, epochs, batch_size, samples_per_sec)
        note = (f"⚠️ 单位陷阱: 吞吐按 samples/s 给出 ({samples_per_sec:g}),即 {steps_per_sec:.4g} 步/秒。"
                f"若误当成 步/秒 代入公式,会得到 {wrong_hours:.2f} 小时,少算了 {batch_size} 倍。")
        if verbose:
            print(note)
    elif steps_per_sec <= 0:
        raise ValueError(f"吞吐应为正数,实际是 {steps_per_sec}")
    total_steps = -(-int(num_samples * epochs) // batch_size)
    hours = training_hours(num_samples, epochs, batch_size, steps_per_sec)
    cost = hours * price_per_hour if price_per_hour is not None else None
    return Estimate(total_steps=total_steps, hours=hours, cost=cost, steps_per_sec=steps_per_sec, note=note)
