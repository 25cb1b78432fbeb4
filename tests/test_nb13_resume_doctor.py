"""What is special to notebook 13 (the resume doctor's capstone); its check's contract (solution, stub, every
wrong answer) is tests/test_exercise_contracts.py, its sweep tests/test_exercise_sweeps.py.

- the learner's trainer is the reference with the four defects, byte for byte (to change the trainer, edit
  ``course_tools/lab/train_tiny_lm.py`` and run ``python -m course_tools.lab.capstone``);
- the solution's two functions are the reference trainer's, line for line: the check's verdict on the solution
  is the verdict on the reference, and each defect's edits apply to both;
- the check reads a learner's cell back whole (imports and helpers too) and pastes it over the two functions;
- beside 4 CPU hogs the check still fails every variant with one defect left, naming it, and passes the solution
  (the doctor's kills count optimizer steps, so the load cannot move them). That proof is a bench, not a test of
  the suite: ``python bench/under_load.py --hogs 4 tests/test_exercise_contracts.py -k resume_doctor``. Run inside
  the suite, its hogs slowed every other xdist worker for eight minutes and flipped the grader's CPU-versus-wall
  verdicts (tests/test_grade.py, tests/test_grade_hostile.py).
"""
from __future__ import annotations

import ast

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb13_resume_doctor import cell_source, check_capstone
from course_tools.lab import capstone
from tests.support.notebook_cells import exercise_pairs, run_source
from tests.support.wrong_answers import nb13_resume_doctor as w13

NOTEBOOK = "13_resume_doctor.ipynb"


def _functions(source: str) -> dict[str, str]:
    """The text of each top-level function of ``source``, without comment lines (the cell's markers and notes)."""
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            body = lines[node.lineno - 1: node.end_lineno]
            found[node.name] = "\n".join(line for line in body if not line.strip().startswith("#"))
    return found


def test_learner_copy_is_the_reference_with_the_four_defects():
    assert capstone.LEARNER_COPY.read_text(encoding="utf-8") == capstone.learner_copy()
    assert capstone.learner_copy() != capstone.trainer_source() and len(capstone.DEFECTS) == 4


def test_solution_functions_are_the_reference_trainers():
    solution, _ = exercise_pairs(NOTEBOOK)[0]
    mine, reference = _functions(solution), _functions(capstone.trainer_source())
    assert set(mine) == {"save_checkpoint", "load_checkpoint"}
    assert all(mine[name] == reference[name] for name in mine), mine


def test_each_defect_applies_once_to_the_solution_and_changes_it():
    solution, _ = exercise_pairs(NOTEBOOK)[0]
    for name in capstone.DEFECTS:
        assert w13.mutant(solution, (name,)) != solution, name


def test_the_check_pastes_the_whole_cell_over_the_two_functions():
    cell = "import math\n\nHALF = 0.5\n\n\ndef save_checkpoint(*a):\n    pass\n\n\ndef load_checkpoint(*a):\n    return 0\n"
    ns = run_source(cell)
    assert cell_source(ns["save_checkpoint"], ns["load_checkpoint"]) == cell
    pasted = capstone.with_functions(cell)
    tree = ast.parse(pasted)
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert names.count("save_checkpoint") == names.count("load_checkpoint") == 1 and "HALF = 0.5" in pasted
    assert "def main(" in pasted and "class TinyLM" in pasted
    assert cell_source(print) == ""   # no source to read back: the check says so instead of guessing


def test_a_cell_without_source_fails_with_a_message():
    ns: dict = {}
    exec(compile(exercise_pairs(NOTEBOOK)[0][0], "<no-linecache>", "exec"), ns)
    with pytest.raises(CheckFailed, match="读不到"):
        check_capstone(ns["save_checkpoint"], ns["load_checkpoint"])
