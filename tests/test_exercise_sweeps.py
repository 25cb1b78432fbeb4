"""The slow 50-seed sweep of every exercise check the registry sweeps (tests/support/exercise_registry.py) that runs in
this process: the solution passes and every typical wrong answer fails on each seed, so the default seed's cases are not
lucky (``tests/support/sweep.sweep_exercise``).

Its own file (not test_exercise_contracts.py): the sweeps take minutes, and pytest-xdist gives a file to one worker.
The checks that start processes (13's resume doctor, marked ``slow`` in the registry) are swept in
tests/test_exercise_sweeps_processes.py, a file of their own, so that another worker runs them beside these.
"""
from __future__ import annotations

import pytest

from tests.support.exercise_registry import EXERCISES
from tests.support.sweep import sweep_exercise

pytestmark = pytest.mark.slow

SWEPT = [pytest.param(e, id=e.id) for e in EXERCISES if e.sweep_seeds is not None and not e.slow]


@pytest.mark.parametrize("exercise", SWEPT)
def test_verdicts_do_not_depend_on_the_seed(exercise, request):
    sweep_exercise(exercise, request)
