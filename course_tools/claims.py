"""Tie a notebook's prose to the value computed under it.

A sentence such as "EMA 的准确率更高" or "loss 在下降" is a claim about a number the cell
just measured. ``claim`` checks it in that same cell:

- under the test suite and ``release --execute`` (``COURSE_CLAIMS=strict``) a false claim
  raises, so prose and output cannot drift apart silently;
- in a learner's notebook it prints one short Chinese note instead: on other hardware a
  number may land elsewhere, and a demo cell must never end in an AssertionError there;
- with ``COURSE_CLAIMS=record:<path>`` (``bench/claims_under_load.py``) it appends one JSON line per
  claim to ``<path>`` (its id, the statement, whether it held, the values) and never raises ``ClaimFailed`` nor prints:
  how often a claim about wall-clock time holds is measured over many runs, not decided by one.

Example::

    claim(acc_ema > acc_raw, "EMA 权重的准确率高于原始权重", ema=acc_ema, raw=acc_raw)
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
from pathlib import Path
from typing import Any

__all__ = ["STRICT_ENV", "RECORD_PREFIX", "ClaimFailed", "is_strict", "record_path", "claim"]

STRICT_ENV = {"COURSE_CLAIMS": "strict"}
RECORD_PREFIX = "record:"  # COURSE_CLAIMS=record:<path>: append each claim to <path> as a JSON line


class ClaimFailed(AssertionError):
    """A statement in the notebook's prose that this run's numbers do not support."""


def is_strict() -> bool:
    """True under the test suite and when solution notebooks are re-executed for release."""
    return os.environ.get("COURSE_CLAIMS", "").strip().lower() == "strict"


def record_path() -> Path | None:
    """The file that ``COURSE_CLAIMS=record:<path>`` names, or None in the other modes."""
    value = os.environ.get("COURSE_CLAIMS", "").strip()
    return Path(value[len(RECORD_PREFIX):]) if value.lower().startswith(RECORD_PREFIX) else None


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _record(path: Path, holds: bool, statement: str, values: dict[str, Any]) -> None:
    """One JSON line: numbers stay numbers (numpy's too), anything else becomes its text; the id is the statement's
    hash, so that it survives cells being added or moved."""
    plain = {k: v if isinstance(v, (bool, int, str)) else float(v) if isinstance(v, numbers.Real) else str(v)
             for k, v in values.items()}
    line = {"id": hashlib.sha1(statement.encode("utf-8")).hexdigest()[:12], "statement": statement,
            "holds": bool(holds), "values": plain}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, ensure_ascii=False) + "\n")


def claim(holds: bool, statement: str, **values: Any) -> bool:
    """Check that ``statement`` (the prose's claim, in Chinese) holds for this run; return ``holds``.

    ``values`` are the measured numbers behind it, shown when the claim fails (and recorded in record mode).
    """
    path = record_path()
    if path is not None:
        _record(path, holds, statement, values)
        return bool(holds)
    if holds:
        return True
    shown = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    if is_strict():
        raise ClaimFailed(f"正文的说法与本次输出不符: {statement}" + (f"({shown})" if shown else ""))
    print(f"⚠️ 注意: 本次运行里“{statement}”不成立" + (f"({shown})" if shown else "")
          + ";数值随硬件和随机种子而变,请结合上面的输出理解正文。")
    return False
