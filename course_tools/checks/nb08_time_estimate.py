"""Checks for 08_time_estimate.ipynb: the training-time formula and its unit trap.

    hours = num_samples * epochs / (batch_size * steps_per_sec * 3600)

The check draws six cases from a fixed seed (so a constant, or an answer tuned to the
chapter's example, cannot pass; the outcome never depends on luck) and adds the
chapter's example read both ways:
0.5 steps/s (about 4.2 h) and 0.5 samples/s, i.e. 0.125 steps/s at batch 4
(about 16.7 h). A wrong answer is named when its ratio to the right one gives it
away: the batch size forgotten, steps/s multiplied instead of divided, seconds
or minutes instead of hours.

The FLOP and memory exercises (08b_flops_memory) are checked in ``nb08b_flops_memory``.

Example (in a check cell)::

    from course_tools.checks.nb08_time_estimate import check_estimate_hours
    check_estimate_hours(estimate_hours)
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from course_tools.checks import call_learner, exercise_check, expect, fail, passed
from course_utils.estimate import training_hours

__all__ = ["REL_TOL", "check_estimate_hours", "HINTS"]


# Counting whole steps per epoch (ceil or floor) is also right; with at least 20,000
# samples and batches of at most 256 that changes the result by under 1.3%.
REL_TOL = 0.02


def _diagnose(ratio: float, batch_size: int, steps_per_sec: float) -> str:
    """A hint naming the typical mistake behind ``answer / reference == ratio``."""
    def near(target: float) -> bool:
        return target > 0 and abs(math.log(ratio / target)) < 0.03

    hints = []
    if near(batch_size):
        hints.append(f"大了 batch_size={batch_size} 倍:忘了除以 batch_size,把 步/秒 当成了 样本/秒")
    if near(1 / batch_size):
        hints.append(f"小了 batch_size={batch_size} 倍:多除了一次 batch_size")
    if near(steps_per_sec ** 2):
        hints.append("像是把 steps_per_sec 乘了上去;总步数应除以 步/秒")
    if near(3600):
        hints.append("大了 3600 倍:结果是秒,需要换算成小时")
    if near(60):
        hints.append("大了 60 倍:结果是分钟,需要换算成小时")
    return f"({';或者'.join(hints)})" if hints else ""


@exercise_check
def check_estimate_hours(estimate_hours: Callable[[int, float, int, float], float], seed: int = 1234) -> None:
    """Compare ``estimate_hours(num_samples, epochs, batch_size, steps_per_sec)`` with the formula.

    ``seed`` fixes the six random cases and the order of all eight.
    """
    rng = np.random.default_rng(seed)
    cases = [(10_000, 3, 4, 0.5),     # the chapter's example read as steps/s: ~4.2 h
             (10_000, 3, 4, 0.125)]   # the same 0.5 read as samples/s (0.5 / 4 steps/s): ~16.7 h
    for _ in range(6):
        cases.append((int(rng.integers(20_000, 2_000_000)), int(rng.integers(1, 40)),
                      int(rng.choice([2, 4, 8, 16, 32, 64, 128, 256])), float(rng.uniform(0.05, 30.0))))
    rng.shuffle(cases)
    for num_samples, epochs, batch_size, steps_per_sec in cases:
        args = f"estimate_hours({num_samples}, {epochs}, {batch_size}, {steps_per_sec:.4g})"
        got = call_learner(estimate_hours, num_samples, epochs, batch_size, steps_per_sec)
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            fail(f"{args} 返回一个数(小时)", f"{type(got).__name__} {got!r}"[:80],
                 "返回计算结果本身,不要返回字符串、元组或 None(需要打印就在函数外面 print)")
        value = float(got)
        want = training_hours(num_samples, epochs, batch_size, steps_per_sec)
        ok = math.isfinite(value) and math.isclose(value, want, rel_tol=REL_TOL)
        hint = _diagnose(value / want, batch_size, steps_per_sec) if not ok and value > 0 and math.isfinite(value) else ""
        expect(ok, f"{args} ≈ {want:.4g} 小时(相对误差 {REL_TOL:.0%} 以内)", f"{value:.4g} 小时{hint}")
    passed(f"estimate_hours 在 {len(cases)} 组规模(6 组随机 + 章节案例的两种读法)上正确(含单位陷阱: 0.5 步/秒 ≈ 4.2 小时,0.5 样本/秒 ≈ 16.7 小时)")


# Hint tiers for hint(): the concept, the section that teaches it, the line that is usually wrong.
HINTS: dict[str, tuple[str, ...]] = {
    "check_estimate_hours": (
        "训练时长 = 总步数 ÷ 每秒步数。总步数由样本数、epoch 数和 batch 大小决定:每一步处理 batch_size 个样本",
        "08 的「5. 章节例子重算,以及单位陷阱」一节用章节的例子把每个量算了一遍,并对比了两种读法",
        "最常错的是单位:steps_per_sec 是「步/秒」不是「样本/秒」,样本数要先按 batch_size 换成步数;"
        "除完得到的是秒,还要换成小时",
    ),
}
