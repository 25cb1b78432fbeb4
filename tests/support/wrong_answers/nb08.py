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
