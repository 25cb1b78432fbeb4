"""Tie a notebook's prose to the value computed under it.

A sentence such as "EMA 的准确率更高" or "loss 在下降" is a claim about a number the cell
just measured. ``claim`` checks it in that same cell:

- under the test suite and ``release --execute`` (``COURSE_CLAIMS=strict``) a false claim
  raises, so prose and output cannot drift apart silently;
- in a learner's notebook it prints one short Chinese note instead: on other hardware a
  number may land elsewhere, and a demo cell must never end in an AssertionError there.

Example::

    claim(acc_ema > acc_raw, "EMA 权重的准确率高于原始权重", ema=acc_ema, raw=acc_raw)
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["STRICT_ENV", "ClaimFailed", "is_strict", "claim"]

STRICT_ENV = {"COURSE_CLAIMS": "strict"}


class ClaimFailed(AssertionError):
    """A statement in the notebook's prose that this run's numbers do not support."""


def is_strict() -> bool:
    """True under the test suite and when solution notebooks are re-executed for release."""
    return os.environ.get("COURSE_CLAIMS", "").strip().lower() == "strict"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def claim(holds: bool, statement: str, **values: Any) -> bool:
    """Check that ``statement`` (the prose's claim, in Chinese) holds for this run; return ``holds``.

    ``values`` are the measured numbers behind it, shown when the claim fails.
    """
    if holds:
        return True
    shown = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    if is_strict():
        raise ClaimFailed(f"正文的说法与本次输出不符: {statement}" + (f"({shown})" if shown else ""))
    print(f"⚠️ 注意: 本次运行里“{statement}”不成立" + (f"({shown})" if shown else "")
          + ";数值随硬件和随机种子而变,请结合上面的输出理解正文。")
    return False
