"""The slow 50-seed sweep of every exercise check the registry sweeps (tests/support/exercise_registry.py): the
solution passes and every typical wrong answer fails on each seed, so the default seed's cases are not lucky.

Its own file (not test_exercise_contracts.py): the sweeps take about two minutes, and pytest-xdist gives a file to
one worker.
"""
from __future__ import annotations

import pytest

from course_tools.checks import CheckFailed
from tests.support.exercise_registry import EXERCISES
from tests.support.notebook_cells import run_source

pytestmark = pytest.mark.slow

SWEPT = [pytest.param(e, id=e.id) for e in EXERCISES if e.sweep_seeds is not None]


@pytest.mark.parametrize("exercise", SWEPT)
def test_verdicts_do_not_depend_on_the_seed(exercise, request):
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
