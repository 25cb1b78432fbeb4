"""Typical wrong answers of notebook 08_time_estimate: estimate_hours (functions; None: no fragment, only the 期望 message).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

import math

WRONG_ANSWERS = {
    # the unit trap: steps/s used as if it were samples/s, i.e. the batch size forgotten
    "forgets_batch_size": (lambda n, e, b, s: n * e / s / 3600, "忘了除以 batch_size"),
    # steps/s multiplied instead of divided
    "multiplies_steps_per_sec": (lambda n, e, b, s: n * e / b * s / 3600, "乘了上去"),
    # the batch size divided out twice (once for steps, once "for samples/s")
    "divides_by_batch_twice": (lambda n, e, b, s: n * e / (b * b * s * 3600), "多除了一次"),
    # the batch size in the numerator: samples × batch
    "multiplies_by_batch": (lambda n, e, b, s: n * e * b / (s * 3600), None),
    # seconds or minutes instead of hours
    "returns_seconds": (lambda n, e, b, s: n * e / (b * s), "结果是秒"),
    "returns_minutes": (lambda n, e, b, s: n * e / (b * s * 60), "结果是分钟"),
    # days instead of hours
    "returns_days": (lambda n, e, b, s: n * e / (b * s * 86_400), None),
    # a typo in the seconds per hour
    "divides_by_360": (lambda n, e, b, s: n * e / (b * s * 360), None),
    # one epoch only
    "ignores_epochs": (lambda n, e, b, s: n / (b * s * 3600), None),
    # whole hours: floor division or rounding up to bill by the hour
    "floor_hours": (lambda n, e, b, s: n * e / b / s // 3600, None),
    "ceil_hours": (lambda n, e, b, s: float(math.ceil(n * e / (b * s * 3600))), None),
    # a constant tuned to the chapter's example (about 4.17 h)
    "constant_chapter_answer": (lambda n, e, b, s: 10_000 * 3 / (4 * 0.5 * 3600), None),
    # the number formatted for printing instead of returned
    "returns_string": (lambda n, e, b, s: f"{n * e / (b * s * 3600):.2f}", "返回一个数"),
    # hours and cost together
    "returns_tuple": (lambda n, e, b, s: (n * e / (b * s * 3600), 2.4 * n * e / (b * s * 3600)), "返回一个数"),
    # forgot the return statement
    "returns_none": (lambda n, e, b, s: None, "返回一个数"),
}


def _plan(work_h, price, mtbf_min, save, restart, *, tau=None, m_unit=60, restart_on=True, save_in_exp=True):
    """The right computation with one knob turned: the mistakes below."""
    m = mtbf_min * m_unit
    tau = math.sqrt(2 * save * m) if tau is None else tau(save, m)
    wall = m * (math.exp(restart / m) if restart_on else 1) * (math.exp((tau + (save if save_in_exp else 0)) / m) - 1)
    return tau, wall * work_h * 3600 / tau / 3600 * price


# checkpoint_plan(work_hours, price_per_hour, mtbf_minutes, save_seconds, restart_seconds) -> (tau_s, yuan)
WRONG_PLANS = {
    # the restart tax left out: no e^{R/M}
    "forgets_restart": (lambda w, p, m, c, r: _plan(w, p, m, c, r, restart_on=False), "忘了重启成本 R"),
    # M used in minutes next to C and R in seconds
    "minutes_as_seconds": (lambda w, p, m, c, r: _plan(w, p, m, c, r, m_unit=1), "√60"),
    # the square root dropped: 2·C·M
    "drops_sqrt": (lambda w, p, m, c, r: _plan(w, p, m, c, r, tau=lambda c_, m_: 2 * c_ * m_), "漏了平方根"),
    # the interval taken as M itself
    "interval_is_mtbf": (lambda w, p, m, c, r: _plan(w, p, m, c, r, tau=lambda c_, m_: m_), "不是 M 本身"),
    # the saves' own time left out of the exponent
    "ignores_save_cost": (lambda w, p, m, c, r: _plan(w, p, m, c, r, save_in_exp=False), "保存本身的时间"),
    # the bill of the work alone, as if nothing were preempted
    "work_only": (lambda w, p, m, c, r: (_plan(w, p, m, c, r)[0], w * p), "只算了工作时间"),
    # √(C·M): the 2 forgotten
    "forgets_two": (lambda w, p, m, c, r: _plan(w, p, m, c, r, tau=lambda c_, m_: math.sqrt(c_ * m_)), None),
    # hours instead of yuan
    "returns_hours": (lambda w, p, m, c, r: (_plan(w, p, m, c, r)[0], _plan(w, p, m, c, r)[1] / p), None),
    # the interval in minutes
    "interval_in_minutes": (lambda w, p, m, c, r: (_plan(w, p, m, c, r)[0] / 60, _plan(w, p, m, c, r)[1]), None),
    # the two numbers swapped
    "swapped": (lambda w, p, m, c, r: _plan(w, p, m, c, r)[::-1], None),
    # one number only, or printed
    "returns_yuan_only": (lambda w, p, m, c, r: _plan(w, p, m, c, r)[1], "返回两个数"),
    "returns_string": (lambda w, p, m, c, r: f"{_plan(w, p, m, c, r)}", "返回两个数"),
    "returns_none": (lambda w, p, m, c, r: None, "返回两个数"),
}
