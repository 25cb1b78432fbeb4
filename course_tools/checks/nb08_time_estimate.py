"""Checks for 08_time_estimate.ipynb: the training-time formula and its unit trap, and §8's checkpoint plan.

``check_estimate_hours``: hours = num_samples * epochs / (batch_size * steps_per_sec * 3600) on six cases drawn
from a fixed seed (a constant, or an answer tuned to the chapter's example, cannot pass) and the chapter's example
read both ways (steps/s and samples/s); a wrong answer is named by its ratio to the right one (:func:`_diagnose`).
``check_checkpoint_plan``: Young's interval τ* = √(2·C·M) and the expected ¥ of the job saving every τ*
(``course_utils.estimate_ckpt``) on six seeded cases whose restart and save times make each typical mistake
(R forgotten, minutes taken as seconds, the square root dropped, M as the interval, the saves' own time left out)
move the answer by more than the 2% tolerance, and the chapter's example at M = 2 h. 08b is ``nb08b_flops_memory``.

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
from course_utils.estimate_ckpt import expected_run, expected_wall_time

__all__ = ["REL_TOL", "check_estimate_hours", "check_checkpoint_plan", "HINTS"]


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


def _plan_diagnosis(tau: float, yuan: float, case: tuple[float, float, float, float, float]) -> str:
    """A hint naming the typical mistake behind a wrong (τ, ¥) of ``case``: the closest one within 1%."""
    work_h, price, mtbf_min, save, restart = case
    m, ref = mtbf_min * 60, expected_run(work_h * 3600, save, restart, mtbf_min * 60, price)
    if tau <= 0 or yuan <= 0:
        return ""
    ignored = expected_wall_time(work_h * 3600, ref.interval_s, 0, restart, m) * price / 3600
    mistakes = [  # (τ it gives, ¥ it gives or None: any, the hint)
        (math.sqrt(2 * save * mtbf_min), None, "τ 小了 √60 ≈ 7.7 倍: M 是分钟,先换成秒(C、R、M 用同一个单位)"),
        (m, None, "间隔不是 M 本身: 存得太少,每次抢占平均丢掉半个间隔"),
        (2 * save * m, None, "漏了平方根: τ* = √(2·C·M)"),
        (ref.interval_s, ref.yuan / math.exp(restart / m), "忘了重启成本 R: 每次抢占后还要付 R 秒,期望时间要乘 e^{R/M}"),
        (ref.interval_s, ignored, "漏了保存本身的时间 C: 一段是 τ + C 秒,指数里是 (τ + C)/M"),
        (ref.interval_s, work_h * price, "只算了工作时间: 抢占后重做的工作、重启和保存都要付钱"),
    ]
    scored = [(max(abs(math.log(tau / t)), abs(math.log(yuan / y)) if y else 0.0), hint) for t, y, hint in mistakes]
    distance, hint = min(scored)
    return hint if distance < 0.01 else ""


@exercise_check
def check_checkpoint_plan(checkpoint_plan: Callable[[float, float, float, float, float], tuple[float, float]],
                          seed: int = 1234) -> None:
    """Compare ``checkpoint_plan(work_hours, price_per_hour, mtbf_minutes, save_seconds, restart_seconds)``, which
    returns (τ* in seconds, expected ¥), with ``course_utils.estimate_ckpt.expected_run`` on seven cases."""
    rng = np.random.default_rng(seed)
    cases = [(4.2, 2.4, 120.0, 10.0, 120.0)]  # the chapter's LoRA-7B run, preempted every 2 h on average
    for _ in range(6):
        mtbf_min = float(rng.uniform(20, 240))
        cases.append((float(rng.uniform(2, 60)), float(rng.uniform(1, 30)), mtbf_min,
                      float(mtbf_min * 60 * rng.uniform(0.003, 0.02)), float(mtbf_min * 60 * rng.uniform(0.04, 0.25))))
    rng.shuffle(cases)
    for case in cases:
        args = "checkpoint_plan(" + ", ".join(f"{v:.4g}" for v in case) + ")"
        got = call_learner(checkpoint_plan, *case)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in got)):
            fail(f"{args} 返回两个数 (τ* 秒, 期望费用 元)", f"{type(got).__name__} {got!r}"[:80],
                 "return tau, yuan: 两个数本身,不要字符串或 None")
        tau, yuan = float(got[0]), float(got[1])
        ref = expected_run(case[0] * 3600, case[3], case[4], case[2] * 60, case[1])
        ok = all(math.isfinite(v) for v in (tau, yuan)) and math.isclose(tau, ref.interval_s, rel_tol=REL_TOL) \
            and math.isclose(yuan, ref.yuan, rel_tol=REL_TOL)
        hint = "" if ok or not all(math.isfinite(v) for v in (tau, yuan)) else _plan_diagnosis(tau, yuan, case)
        expect(ok, f"{args} ≈ (τ* {ref.interval_s:.4g} 秒, {ref.yuan:.4g} 元)(相对误差 {REL_TOL:.0%} 以内)",
               f"(τ* {tau:.4g} 秒, {yuan:.4g} 元)", hint)
    passed(f"checkpoint_plan 在 {len(cases)} 组抢占场景上正确(含章节例子: M = 2 小时时 τ* ≈ 6.3 分钟)")


HINTS: dict[str, tuple[str, ...]] = {
    "check_estimate_hours": (
        "训练时长 = 总步数 ÷ 每秒步数。总步数由样本数、epoch 数和 batch 大小决定:每一步处理 batch_size 个样本",
        "08 的「5. 章节例子重算,以及单位陷阱」一节用章节的例子把每个量算了一遍,并对比了两种读法",
        "最常错的是单位:steps_per_sec 是「步/秒」不是「样本/秒」,样本数要先按 batch_size 换成步数;"
        "除完得到的是秒,还要换成小时",
    ),
    "check_checkpoint_plan": (
        "抢占随机发生,平均每 M 秒一次;存得勤,保存本身花时间,存得少,每次抢占丢的工作多:τ* = √(2·C·M) 平衡两者",
        "08 的「7. 抢占式实例:多久存一次检查点(Young/Daly 间隔)」一节推导了期望时间 M·e^{R/M}·(e^{(τ+C)/M} − 1)·W/τ 并用章节例子算了一遍",
        "最常错的是单位: 工作是小时、M 是分钟、C 和 R 是秒,全部先换成秒再代入;指数里是 τ + C,前面的 e^{R/M} 别漏",
    ),
}
