"""How often to checkpoint on a preemptible card: the expected wall time and cost, Young's and Daly's interval.

What: a job needs ``W`` seconds of work. It saves a checkpoint every ``τ`` seconds of work; a save takes ``C``
seconds. A preemption (spot instance reclaimed, node lost) strikes at random, on average every ``M`` seconds;
after one the job pays the restart tax ``R`` (a new process, ``import torch``, the data, loading the checkpoint,
warm-up) and redoes the work since the last save. Under exponential failures (a Poisson process: memoryless,
rate ``1/M``, striking during work, saves and restarts alike) the expected wall time is exactly::

    E[T] = M · e^{R/M} · (e^{(τ+C)/M} − 1) · W/τ

Derivation (one segment of ``L = τ + C`` seconds that must run without a preemption). From the segment's start,
the time until it ends or a preemption strikes is ``min(X, L)`` with ``X ~ Exp(M)``: ``E[min(X, L)] = M(1 − e^{−L/M})``,
and a preemption strikes with probability ``1 − e^{−L/M}``. After one, the restart and the segment (``R + L``) must
run without a preemption; repeating until they do takes ``Y = M(e^{(R+L)/M} − 1)`` (the same argument:
``Y = M(1 − e^{−(R+L)/M}) + (1 − e^{−(R+L)/M}) Y``). So a segment takes
``M(1 − e^{−L/M}) + (1 − e^{−L/M}) · M(e^{(R+L)/M} − 1) = M e^{R/M}(e^{L/M} − 1)``, and the job ``W/τ`` of them.
Assumptions: ``W`` is a whole number of intervals (else the last, shorter segment costs a little less); a save
interrupted by a preemption is lost (only finished saves count); the first start is not charged ``R``; ``M`` is
the mean time between preemptions of the wall clock you pay for, not of the work.

Why: "save every hour" is a rule of thumb. Minimising ``(e^{(τ+C)/M} − 1)/τ`` gives the best interval: Young's
``τ* = √(2·C·M)`` (first order in ``C/M``), Daly's refinement (higher orders; it matters once ``C`` is a few
percent of ``M``) and the exact optimum ``τ = M(1 + W₀(−e^{−1−C/M}))``. ``R`` does not move the optimum (it
multiplies every interval's cost by ``e^{R/M}``) but it multiplies the bill.

Pitfall: when ``τ + C + R`` approaches ``M`` the cost grows exponentially: a job whose restart alone takes about
``M`` mostly restarts and, in practice, never finishes. ``ExpectedRun.runaway`` flags it. And keep units apart:
``C``, ``R``, ``M`` and ``τ`` in the same unit (seconds here), the price per hour.

Example::

    run = expected_run(work_s=4.2 * 3600, save_s=10, restart_s=120, mtbf_s=2 * 3600, price_per_hour=2.4)
    print(run.summary())                    # τ* ≈ 6.3 min, the expected hours and ¥
    expected_run(4.2 * 3600, 10, 120, 2 * 3600, 2.4, interval_s=3600).yuan   # "every hour": more

``replay_wall_time`` is one sample path of the same model: a job's wall time under given preemption times, whose
mean over Poisson schedules is ``E[T]`` when τ divides W (plus the first start's expected time when it has one;
``bench/preemption.py`` predicts each run it kills with it).
``IntervalTuner`` is the professional script's ``--ckpt-every-seconds auto --mtbf M``: Young's interval from the
save times it measures, re-estimated after every save. Taught in ``08_time_estimate`` §7 (the model, the
chapter's example at two preemption rates, the bench's plot; §8's exercise and its check compute the same).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["young_interval", "daly_interval", "optimal_interval", "expected_segment_time", "expected_wall_time",
           "replay_wall_time", "ExpectedRun", "expected_run", "IntervalTuner", "tune_saves", "seconds_or_auto"]


def _times(**values: float) -> None:
    """Refuse a time that is negative, infinite or not a number (Chinese message naming it)."""
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} 应为有限的非负秒数,实际是 {value!r}")


def _mtbf(mtbf_s: float) -> None:
    _times(mtbf_s=mtbf_s)
    if mtbf_s == 0:
        raise ValueError("mtbf_s(平均多久被抢占一次)应大于 0 秒")


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's interval ``√(2·C·M)``: seconds of work between checkpoints that minimise the expected wall time.

    Why: the first-order balance of the two losses: a save every ``τ`` costs ``C/τ`` of the time, a preemption
    loses on average ``τ/2`` of work, ``τ/(2M)`` of the time. Pitfall: ``C`` and ``M`` in the same unit (minutes
    and seconds mixed are off by √60 ≈ 7.7x). Example: ``young_interval(10, 7200)`` ≈ 379.5 s.
    """
    _times(save_s=save_s)
    _mtbf(mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's refinement (2006) of Young's interval: ``√(2CM)·[1 + ⅓√(C/2M) + ⅑·C/2M] − C``, ``M`` once ``C ≥ 2M``.

    Why: Young's interval is first order in ``C/M``; when a save takes a few percent of ``M`` it saves too rarely.
    Pitfall: for ``C ≪ M`` the two agree to well under 1%: the refinement only matters for slow saves or
    frequent preemptions. Example: ``daly_interval(10, 7200)`` ≈ 372.8 s (Young: 379.5 s).
    """
    young = young_interval(save_s, mtbf_s)
    if save_s >= 2 * mtbf_s:
        return float(mtbf_s)
    x = save_s / (2 * mtbf_s)
    return young * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def optimal_interval(save_s: float, mtbf_s: float) -> float:
    """The exact minimiser of ``(e^{(τ+C)/M} − 1)/τ``: ``τ = M(1 + W₀(−e^{−1−C/M}))`` (W₀: Lambert's function).

    Why: the reference Young's and Daly's formulas approximate (the tests compare them with it). Found by
    bisection on ``u·e^{−u} = e^{−1−C/M}`` with ``u = 1 − τ/M`` in ``(0, 1)``. Example: ``optimal_interval(10, 7200)``
    ≈ 372.8 s.
    """
    _times(save_s=save_s)
    _mtbf(mtbf_s)
    target, low, high = math.exp(-1 - save_s / mtbf_s), 0.0, 1.0
    for _ in range(200):  # u·e^{-u} rises on (0, 1): bisection to the last bit
        mid = (low + high) / 2
        low, high = (mid, high) if mid * math.exp(-mid) < target else (low, mid)
    return mtbf_s * (1 - (low + high) / 2)


def expected_segment_time(length_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time to get ``length_s`` seconds done without a preemption, paying ``restart_s`` after each one.

    ``M·e^{R/M}·(e^{L/M} − 1)`` (derived in the module docstring). Why: the building block of ``expected_wall_time``;
    with ``restart_s=0`` it is also the time to get through a start-up that a preemption sends back to zero.
    Pitfall: it grows like ``e^{L/M}``: a segment as long as a few ``M`` practically never completes.
    Example: ``expected_segment_time(60, 0, 600)`` ≈ 63.1 s.
    """
    _times(length_s=length_s, restart_s=restart_s)
    _mtbf(mtbf_s)
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(length_s / mtbf_s)


def expected_wall_time(work_s: float, interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time of ``work_s`` seconds of work, saving every ``interval_s`` of work: ``W/τ`` segments of ``τ + C``.

    Why: compare intervals (and "never save": ``interval_s = work_s``) in seconds and money before renting.
    Pitfall: ``interval_s`` counts work, not wall time (a save every τ seconds of *training*). Example:
    ``expected_wall_time(4.2 * 3600, 3600, 10, 120, 7200)`` ≈ 20,017 s against 15,120 s of work.
    """
    _times(work_s=work_s, interval_s=interval_s)
    if interval_s == 0:
        raise ValueError("interval_s(两次保存之间的工作秒数)应大于 0")
    return expected_segment_time(interval_s + save_s, restart_s, mtbf_s) * work_s / interval_s


def replay_wall_time(preemptions_s: Sequence[float], work_s: float, interval_s: float, save_s: float,
                     restart_s: float | Sequence[float], first_start_s: float = 0.0) -> float:
    """Wall time of one job under these preemption times (seconds since its first start): the model, one sample path.

    What: the first start takes ``first_start_s`` (a preemption during it starts it over), every later start
    ``restart_s`` (or, for restarts that vary, the i-th after a finished first start ``restart_s[i]``: give one per
    preemption); then segments of ``interval_s`` seconds of work and a save of ``save_s`` (the last segment may be
    shorter); a preemption loses the unsaved work and the start in progress. Why: ``expected_wall_time`` is the
    mean over Poisson schedules when ``interval_s`` divides ``work_s`` (a shorter last segment still pays a whole
    save), with ``expected_segment_time(first_start_s, 0, M)`` added for the first start; a bench that kills real
    runs at known times can predict each run, and the spread of a few of them, from this.
    Pitfall: one job's time jumps when a preemption falls just before or just after a save; compare medians.
    Example: ``replay_wall_time([6.0], 10, 4, 1, 2)`` = 16.0: 10 s of work, 3 saves, one 2 s restart and the
    second lost since the save at 5 s.
    """
    one = not hasattr(restart_s, "__len__")  # else a list, tuple or array: one restart per preemption
    each = [restart_s] * max(1, len(preemptions_s)) if one else list(restart_s)
    _times(work_s=work_s, interval_s=interval_s, save_s=save_s, first_start_s=first_start_s)
    _times(**{"restart_s" if one else f"restart_s[{i}]": r for i, r in enumerate(each)})
    if len(each) < len(preemptions_s):
        raise ValueError(f"restart_s 应为每次抢占各给一个秒数: 给了 {len(each)} 个, 抢占有 {len(preemptions_s)} 次")
    if interval_s == 0:
        raise ValueError("interval_s(两次保存之间的工作秒数)应大于 0")
    kills, restarts = sorted(float(k) for k in preemptions_s), iter(each)
    now, done, start, started = 0.0, 0.0, first_start_s, False
    for deadline in [*kills, math.inf]:
        if deadline < now:
            continue
        clock = now + start
        if clock <= deadline:
            started = True
            while done < work_s * (1 - 1e-12):
                segment = min(interval_s, work_s - done)
                if clock + segment + save_s > deadline:
                    break
                clock, done = clock + segment + save_s, done + segment
            else:
                return clock
        now, start = deadline, next(restarts) if started else first_start_s
    raise AssertionError("unreachable: the last deadline is infinite")


@dataclass(frozen=True)
class ExpectedRun:
    """A job on a preemptible card at one checkpoint interval (``expected_run``); times in seconds."""

    work_s: float
    interval_s: float
    save_s: float
    restart_s: float
    mtbf_s: float
    wall_s: float
    price_per_hour: float | None = None

    @property
    def overhead(self) -> float:
        """Expected wall time over the work, minus 1 (0.1: 10% more time and money than an uninterrupted run)."""
        return self.wall_s / self.work_s - 1

    @property
    def preemptions(self) -> float:
        """Expected number of preemptions during the run (wall time over ``M``)."""
        return self.wall_s / self.mtbf_s

    @property
    def yuan(self) -> float | None:
        return None if self.price_per_hour is None else self.wall_s / 3600 * self.price_per_hour

    @property
    def runaway(self) -> bool:
        """True when restarting dominates: the run is expected to take more than twice its work."""
        return self.wall_s > 2 * self.work_s

    def summary(self) -> str:
        text = (f"每 {self.interval_s / 60:.1f} 分钟工作存一次: 期望 {self.wall_s / 3600:.2f} 小时"
                f"(工作 {self.work_s / 3600:.2f} 小时,多 {self.overhead:.1%}),期望被抢占 {self.preemptions:.1f} 次")
        if self.yuan is not None:
            text += f",约 {self.yuan:.1f} 元"
        if self.runaway:
            text += ";⚠️ 重启和重做吞掉了大部分时间: 先缩短重启(R)、加快保存,或换更稳定的实例"
        return text


def expected_run(work_s: float, save_s: float, restart_s: float, mtbf_s: float, price_per_hour: float | None = None,
                 interval_s: float | None = None) -> ExpectedRun:
    """The job at ``interval_s`` (default: Young's ``√(2CM)``): expected wall time, overhead, preemptions, cost.

    Why: one call answers "how often, and what will it cost". Pitfall: the price is per hour, every time in
    seconds. Example: ``expected_run(4.2 * 3600, 10, 120, 7200, 2.4).yuan`` ≈ 10.8 (uninterrupted: 10.1).
    """
    if price_per_hour is not None:
        _times(price_per_hour=price_per_hour)
    interval = young_interval(save_s, mtbf_s) if interval_s is None else interval_s
    return ExpectedRun(work_s, interval, save_s, restart_s, mtbf_s,
                       expected_wall_time(work_s, interval, save_s, restart_s, mtbf_s), price_per_hour)


class IntervalTuner:
    """Young's interval from the save times measured so far (their median), re-estimated after every save.

    Why: ``C`` depends on the model, the disk and the load of this machine: measure it in the run instead of
    guessing. Before the first save is measured it assumes ``first_guess_s`` (1 s: a first save falls due after
    ``√(2·1·M)``). Pitfall: with asynchronous saves ``C`` is the stall the loop sees (the copy to host
    memory), not the write. Example::

        tuner = IntervalTuner(mtbf_s=6 * 3600)
        manager.every_seconds = tuner.observe(seconds_the_save_took)
    """

    def __init__(self, mtbf_s: float, first_guess_s: float = 1.0) -> None:
        _mtbf(mtbf_s)
        _times(first_guess_s=first_guess_s)
        self.mtbf_s, self.first_guess_s = mtbf_s, first_guess_s
        self.saves: list[float] = []

    @property
    def save_s(self) -> float:
        return statistics.median(self.saves) if self.saves else self.first_guess_s

    @property
    def interval_s(self) -> float:
        return young_interval(self.save_s, self.mtbf_s)

    def observe(self, seconds: float) -> float:
        """Record one save's measured duration; the new interval."""
        _times(seconds=seconds)
        self.saves.append(float(seconds))
        return self.interval_s


def tune_saves(manager: Any, mtbf_s: float, report: Any = print) -> IntervalTuner:
    """``--ckpt-every-seconds auto``: time every ``manager.save`` and set ``manager.every_seconds`` to Young's interval.

    What: wraps the save of this one manager (a ``CheckpointManager``: ``save`` and ``every_seconds``); after each
    save the interval is re-estimated from the median of the saves so far. Why: the script then saves as often as
    its measured cost and the given ``M`` call for, on any disk and model. Pitfall: the interval counts wall time
    from the end of the last save, and the epoch-end and ``--ckpt-every-steps`` saves count as saves too.
    ``report`` says the interval once, after the first measured save. Example::

        manager = CheckpointManager(out / "checkpoints")
        tune_saves(manager, mtbf_s=6 * 3600)   # then manager.should_save(step) as before
    """
    tuner = IntervalTuner(mtbf_s)
    manager.every_seconds = tuner.interval_s
    save = manager.save

    def timed_save(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        path = save(*args, **kwargs)
        manager.every_seconds = tuner.observe(time.perf_counter() - start)
        if len(tuner.saves) == 1:
            report(f"--ckpt-every-seconds auto: 一次保存停顿 {tuner.save_s * 1000:.0f} ms,M = {mtbf_s:g} 秒 → "
                   f"每 {manager.every_seconds:.3g} 秒存一次(Young 间隔,之后每次保存都重新估计)")
        return path

    manager.save = timed_save
    return tuner


def seconds_or_auto(text: str) -> float | str:
    """argparse type of ``--ckpt-every-seconds``: seconds (>= 0; 0: off) or ``auto`` (with ``--mtbf``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: {seconds_or_auto.validates}")
    return value


seconds_or_auto.validates = "应为秒数(>= 0)或 auto"  # a validator, as course_utils.cli's (its unchecked_options)
