"""Reproducible verdicts of the exercise checks (issue 13 item 4): the slow 50-seed sweeps, and
the same failure message on every run.

Each check takes a ``seed`` argument; a sweep runs it with ``SWEEP_SEEDS`` on the right
answer and on every typical wrong answer and expects the same verdicts as with the
default seed, proving the fixed cases are not lucky.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

from course_tools.checks import CheckFailed


SWEEP_SEEDS = range(1000, 1050)


def failure_twice(check: Callable[..., Any], *args: Any) -> str:
    """Run ``check(*args)`` twice; both runs must fail with the same message, which is returned."""
    messages = []
    for _ in range(2):
        with pytest.raises(CheckFailed) as info:
            check(*args)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return messages[0]


def fails_naming(check: Callable[..., Any], fn: Callable[..., Any], hint: str | None = None, **kwargs: Any) -> str:
    """``check(fn, **kwargs)`` fails with an 期望/实际 message that names ``hint`` when one is given; the message."""
    with pytest.raises(CheckFailed) as info:
        check(fn, **kwargs)
    message = str(info.value)
    assert message.startswith("期望"), message
    if hint:
        assert hint in message, (kwargs, message)
    return message


def sweep_verdicts(check: Callable[..., Any], solution: Callable[..., Any],
                   wrong: dict[str, tuple[Callable[..., Any], str | None]], seeds=range(1, 51)) -> None:
    """With every seed: the check passes on ``solution`` and fails on each wrong answer, naming its hint."""
    for seed in seeds:
        check(solution, seed=seed)
        for fn, hint in wrong.values():
            fails_naming(check, fn, hint, seed=seed)
