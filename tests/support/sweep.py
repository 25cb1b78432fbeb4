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
from tests.support.notebook_cells import run_source


SWEEP_SEEDS = range(1000, 1050)


def sweep_exercise(exercise: Any, request: pytest.FixtureRequest) -> None:
    """An exercise record's sweep (``tests/support/exercise_registry.Exercise``): with each of its ``sweep_seeds``, the
    check passes the solution and fails every wrong answer (naming its fragment where the record asks).

    Two test files call it, each for its own part of the registry, so that pytest-xdist's workers (one file each)
    run the long sweeps side by side: ``tests/test_exercise_sweeps.py`` (checks that run in this process) and
    ``tests/test_exercise_sweeps_processes.py`` (checks that start processes: 13's resume doctor).
    """
    if exercise.sweep_threads:
        request.getfixturevalue("workbook_threads")
    solution, _ = exercise.pair()
    right = run_source(solution)
    wrong = {name: (make(solution), fragment) for name, (make, fragment) in exercise.wrong.items()}
    assert wrong, exercise.id
    for seed in exercise.sweep_seeds:
        exercise.run(right, seed=seed)
        for name, (ns, fragment) in wrong.items():
            with pytest.raises(CheckFailed) as info:
                exercise.run(ns, seed=seed)
            if exercise.sweep_fragments:
                exercise.assert_names(fragment, str(info.value))


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
