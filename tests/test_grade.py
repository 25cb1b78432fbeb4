"""The instructor grader (course_tools.grade) on a tiny reference notebook pair.

tests/fixtures/grading/solutions/01_fixture.ipynb has two exercises (add, square), each
followed by a check cell, plus a solution-only cell. All submissions below are graded
in one ``grade_all`` call (one pytest+nbval subprocess per notebook), as an instructor
would, so the slow parts run once.
"""
from __future__ import annotations

import copy
import csv
from pathlib import Path

import nbformat
import pytest

from course_tools import grade
from course_tools.release import learner_notebook

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "grading" / "solutions"
NAME = "01_fixture.ipynb"
CELL_TIMEOUT = 15


def _reference() -> nbformat.NotebookNode:
    return nbformat.read(FIXTURE / NAME, as_version=4)


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _write(folder: Path, nb, name: str = NAME) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions")
    ref = _reference()
    stub = learner_notebook(ref)
    subs = {}
    subs["solved"] = _write(root / "solved", ref)                      # the reference itself
    subs["stub"] = _write(root / "stub", stub)                         # the released notebook, untouched

    broken = copy.deepcopy(stub)                                       # add solved, square wrong
    _cell(broken, "ex-add").source = "def add(a, b):\n    return a + b"
    _cell(broken, "ex-square").source = "def square(x):\n    return 2 * x"
    subs["broken"] = _write(root / "broken", broken)

    tampered = copy.deepcopy(broken)                                   # check cell "fixed" by the learner
    _cell(tampered, "check-square").source = "print('✅ square 正确')"
    tampered.cells = [c for c in tampered.cells if c.get("id") != "check-add"]  # and one deleted
    subs["tampered"] = _write(root / "tampered", tampered)

    loop = copy.deepcopy(stub)                                         # square never returns
    _cell(loop, "ex-add").source = "def add(a, b):\n    return a + b"
    _cell(loop, "ex-square").source = "def square(x):\n    while True:\n        pass"
    subs["loop"] = _write(root / "loop", loop)

    dies = copy.deepcopy(stub)                                         # exercise cell kills the kernel
    _cell(dies, "ex-add").source = "import os\nos._exit(3)"
    subs["dies"] = _write(root / "dies", dies)

    old = copy.deepcopy(ref)                                           # older version: other ids, one exercise
    old.cells = [c for c in old.cells if c.get("id") != "ex-square"]
    _cell(old, "ex-add").id = "old-add-id"
    subs["old"] = _write(root / "old", old)

    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / NAME).write_text('{"cells": [ {"cell_type": "code", ', encoding="utf-8")
    subs["corrupt"] = corrupt

    loose = root / "01_loose.ipynb"                                    # a loose file: learner = file name
    nbformat.write(ref, loose)
    subs["loose"] = loose

    order = ["solved", "stub", "broken", "tampered", "loop", "dies", "old", "corrupt", "loose"]
    grades = grade.grade_all([subs[k] for k in order], solutions=FIXTURE, cell_timeout=CELL_TIMEOUT,
                             total_timeout=240, jobs=3, verbose=False)
    by_learner = {g.learner: g for g in grades}
    report = root / "grades.csv"
    grade.write_csv(grades, report)
    return by_learner, report


def test_solutions_score_full(graded):
    g = graded[0]["solved"]
    assert (g.passed, g.total, g.score) == (2, 2, 1.0), g.notes
    assert g.notes == []


def test_released_stubs_score_zero(graded):
    g = graded[0]["stub"]
    assert (g.passed, g.total) == (0, 2)
    assert sum("练习尚未完成" in n for n in g.notes) == 2


def test_one_broken_exercise_loses_only_its_check(graded):
    g = graded[0]["broken"]
    assert (g.passed, g.total) == (1, 2)
    assert len(g.notes) == 1 and "square" in g.notes[0] and "期望" in g.notes[0]


def test_tampered_or_deleted_check_cells_are_restored(graded):
    g = graded[0]["tampered"]
    assert (g.passed, g.total) == (1, 2), g.notes
    assert any("square" in n and "期望" in n for n in g.notes)


def test_infinite_loop_is_stopped_and_others_still_graded(graded):
    g = graded[0]["loop"]
    assert (g.passed, g.total) == (1, 2), g.notes
    assert any("超过单格时限" in n for n in g.notes), g.notes
    assert graded[0]["solved"].score == 1.0 and graded[0]["broken"].passed == 1


def test_kernel_exit_is_graded_zero_with_note(graded):
    g = graded[0]["dies"]
    assert (g.passed, g.total) == (0, 2)
    assert any("内核已退出" in n for n in g.notes), g.notes


def test_older_version_is_matched_by_order_and_noted(graded):
    g = graded[0]["old"]
    assert (g.passed, g.total) == (1, 2), g.notes                     # add matched by order; square missing
    assert any("旧版本" in n and "按顺序匹配 1" in n and "未找到练习 [2]" in n for n in g.notes), g.notes


def test_corrupt_file_is_reported_not_crashed_on(graded):
    g = graded[0]["corrupt"]
    assert (g.passed, g.total) == (0, 2)
    assert any("不是有效的 notebook JSON" in n for n in g.notes)


def test_loose_notebook_learner_is_file_name_and_csv_columns(graded):
    by_learner, report = graded
    assert by_learner["01_loose.ipynb"].score == 1.0
    with open(report, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == grade.COLUMNS
    assert len(rows) == 9
    for row in rows:
        assert 0.0 <= float(row["score"]) <= 1.0
    assert {r["learner"]: r["score"] for r in rows}["solved"] == "1.000"


def test_merge_takes_only_exercise_sources_from_the_learner():
    ref = _reference()
    sub = learner_notebook(ref)
    _cell(sub, "ex-add").source = "def add(a, b):\n    return 0"
    _cell(sub, "ex-add").metadata["tags"] = ["exercise", "nbval-skip"]  # tags are not taken over
    _cell(sub, "check-add").source = "pass"
    sub.cells.insert(0, nbformat.v4.new_code_cell("import os"))         # extra cells are ignored
    merged, notes = grade.merge(ref, sub)
    assert notes == []
    assert _cell(merged, "ex-add").source.endswith("return 0")
    assert _cell(merged, "ex-add").metadata["tags"] == ["exercise"]
    assert _cell(merged, "check-add").source == _cell(ref, "check-add").source
    assert "NotImplementedError" in _cell(merged, "ex-square").source    # learner's stub kept
    assert all(c.get("id") != "sol-only" for c in merged.cells)         # solution-only cells dropped
    assert [c.get("id") for c in merged.cells if c.cell_type == "code"][0] == "setup"


def test_collect_folder_of_learner_folders(tmp_path):
    for learner in ("ann", "ben"):
        _write(tmp_path / "class" / learner, _reference())
    pairs = grade.collect([tmp_path / "class"])
    assert [(l, p.name) for l, p in pairs] == [("ann", NAME), ("ben", NAME)]
    assert grade.find_reference(Path("01_fixture (1).ipynb"), FIXTURE) == FIXTURE / NAME
