"""The sweep of the exercise checks that start processes (the registry's ``slow`` records: 13's resume doctor runs
about eight training processes per check), as tests/test_exercise_sweeps.py sweeps the others
(``tests/support/sweep.sweep_exercise``).

A file of its own because pytest-xdist gives a file to one worker: the doctor's sweep and the in-process sweeps (each
several minutes on a 2-core machine) run side by side on two workers instead of one after the other.
"""
from __future__ import annotations

import pytest

from tests.support.exercise_registry import EXERCISES
from tests.support.sweep import sweep_exercise

pytestmark = pytest.mark.slow

SWEPT = [pytest.param(e, id=e.id) for e in EXERCISES if e.sweep_seeds is not None and e.slow]


@pytest.mark.parametrize("exercise", SWEPT)
def test_verdicts_do_not_depend_on_the_seed(exercise, request):
    sweep_exercise(exercise, request)
