"""The contract every exercise check keeps, parametrized over tests/support/exercise_registry.py.

For each exercise: the check passes the solution (✅ printed) and fails the released stub with the
not-finished message; the stub's hints give away no line of the answer; every typical wrong answer
fails with its fragment (tests/support/wrong_answers/); the slow 50-seed sweeps are test_exercise_sweeps.py. For
each notebook of DEMO_ISOLATED: its demo cells never call an exercise (tests/support/exercise_isolation.py).
"""
from __future__ import annotations

import pytest

from course_tools.checks import CheckFailed
from tests.support.exercise_isolation import demo_cells_using_exercises
from tests.support.exercise_registry import DEMO_ISOLATED, EXERCISES, NOTEBOOKS, Exercise
from tests.support.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.support.sweep import failure_twice

BY_ID = {e.id: e for e in EXERCISES}
assert len(BY_ID) == len(EXERCISES), "two records with one id"

WRONG_CASES = [pytest.param(e, name, id=f"{e.id}:{name}", marks=e.marks) for e in EXERCISES for name in e.wrong]
# an exercise whose check starts training processes (13's resume doctor) is marked slow
CASES = [pytest.param(e, id=e.id, marks=e.marks) for e in EXERCISES]


def _fails(exercise: Exercise, name: str, ns: dict) -> str:
    """The wrong answer ``name`` fails (twice with the same message where the record asks); the message."""
    if name in exercise.twice:
        return failure_twice(exercise.run, ns)
    with pytest.raises(CheckFailed) as info:
        exercise.run(ns)
    return str(info.value)


def test_ids_are_as_documented():
    assert "03_ema:ema_update_" in BY_ID and set(NOTEBOOKS) >= set(DEMO_ISOLATED)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda n: n.removesuffix(".ipynb"))
def test_each_exercise_cell_has_one_record(notebook):
    indices = sorted(e.index for e in EXERCISES if e.notebook == notebook)
    assert indices == list(range(len(exercise_pairs(notebook)))), (notebook, indices)


@pytest.mark.parametrize("exercise", CASES)
def test_solution_passes(exercise, capsys):
    solution, _ = exercise.pair()
    exercise.run(run_source(solution))
    out = capsys.readouterr().out
    assert out.startswith("✅") if exercise.solution_starts else "✅" in out, out


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_stub_fails_as_not_finished(exercise):
    _, stub = exercise.pair()
    assert "raise NotImplementedError" in stub and "### BEGIN SOLUTION" not in stub
    ns = run_source(stub)
    if exercise.stub_raises:
        exercise.stub_raises(ns)
    with pytest.raises(CheckFailed, match=exercise.stub_message):
        exercise.run(ns)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_stub_hints_give_no_line_of_the_answer(exercise):
    solution, stub = exercise.pair()
    hints = stub_hints(stub)
    if exercise.hint_count is not None:
        assert len(hints) == exercise.hint_count, hints
    # every hint of the notebook, so no exercise's hint gives away another one's answer either
    everything = "".join(h for _, s in exercise_pairs(exercise.notebook) for h in stub_hints(s))
    leaked = answer_lines_in(everything, solution, min_chars=exercise.hint_min_chars)
    assert not leaked, leaked


@pytest.mark.parametrize("exercise, name", WRONG_CASES)
def test_wrong_answer_fails_with_its_fragment(exercise, name):
    make, fragment = exercise.wrong[name]
    solution, _ = exercise.pair()
    exercise.assert_names(fragment, _fails(exercise, name, make(solution)))


@pytest.mark.parametrize("notebook", DEMO_ISOLATED, ids=lambda n: n.removesuffix(".ipynb"))
def test_demo_cells_never_call_an_exercise(notebook):
    assert demo_cells_using_exercises(notebook) == []
