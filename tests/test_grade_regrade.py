"""course_grader.regrade: every row stamped, ``--regrade OLD.csv`` re-runs only the rows whose stamp changed.

The fixture class (tests/fixtures/grading/solutions, benign code, graded without the sandbox as in
test_grade's ``--no-sandbox`` test): ann solves everything, ben's ``square`` is ``x * abs(x)`` (wrong
for negative x), cat hands in the stubs of 01 only. Regrading with the same code starts no kernel and
changes no byte of the rows; a check whose cell changes re-runs only its notebook's rows and the diff
names exactly the learner whose verdict changed. The homework's rows are regraded with a stand-in
check (no script runs).
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import nbformat
import pytest

import course_grader as grade
from course_grader import homework, kernel, regrade, upgrades
from course_grader.collect import Item
from course_grader.report import CheckOutcome, load_report
from course_tools.checks.nb10_homework import UPGRADES
from course_tools.release import learner_notebook

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "grading" / "solutions"
NAME, NAME2 = "01_fixture.ipynb", "02_fixture.ipynb"
OPTIONS = dict(cell_timeout=60, timeout=120, sandbox=False)


def _class(root: Path) -> Path:
    for learner, square, both in (("ann", "x * x", True), ("ben", "x * abs(x)", True), ("cat", None, False)):
        for name in (NAME, NAME2) if both else (NAME,):
            nb = nbformat.read(FIXTURE / name, as_version=4)
            if square is None:
                nb = learner_notebook(nb)
            for cell in nb.cells:
                if cell.get("id") == "ex-square":
                    cell.source = f"def square(x):\n    return {square}"
            (root / learner).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, root / learner / name)
    return root


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def first_grading(tmp_path_factory) -> Path:
    """The class graded once for the module (its kernels are the costly part): solutions/, class/, first/grades.csv."""
    root = tmp_path_factory.mktemp("regrade")
    shutil.copytree(FIXTURE, root / "solutions")
    grade.grade_all([_class(root / "class")], root / "solutions", grade.Options(**OPTIONS), root / "first" / "grades.csv",
                    verbose=False)
    return root


@pytest.fixture()
def graded(first_grading: Path, tmp_path: Path) -> dict[str, Path]:
    """A copy of the first grading for each test (one changes its reference notebook; each regrades into it)."""
    shutil.copytree(first_grading, tmp_path, dirs_exist_ok=True)
    return {"solutions": tmp_path / "solutions", "class": tmp_path / "class", "report": tmp_path / "first" / "grades.csv"}


def _regrade(graded: dict[str, Path], report: Path) -> list:
    options = grade.Options(**OPTIONS, steps={"regrade": {g.key: g for g in load_report(graded["report"])}})
    return grade.grade_all([graded["class"]], graded["solutions"], options, report, verbose=False)


def test_every_row_and_check_is_stamped(graded):
    rows, checks = _rows(graded["report"]), _rows(graded["report"].with_name("grades.checks.csv"))
    assert len(rows) == 6 and all(r["python"] and r["torch"] and len(r["grader"]) == 40 for r in rows)
    by = {(r["learner"], r["notebook"]): r["submission"] for r in rows}
    assert by["ann", NAME] != by["ben", NAME] and len(by["ann", NAME]) == 16 and by["ann", NAME2] == by["ben", NAME2]
    assert by["cat", NAME2] == ""                                  # nothing handed in
    versions = {(c["notebook"], c["check"]): c["version"] for c in checks}
    assert len(checks) == 12 and len(set(versions.values())) == 4 and all(versions.values())


def test_a_regrade_with_the_same_code_runs_nothing_and_changes_nothing(graded, monkeypatch):
    monkeypatch.setattr(kernel, "KernelBox", lambda *a, **k: pytest.fail("a kernel started"))
    again = graded["report"].parent.parent / "again" / "grades.csv"
    _regrade(graded, again)
    for suffix in (".csv", ".checks.csv"):
        assert (again.with_name("grades" + suffix).read_bytes()
                == graded["report"].with_name("grades" + suffix).read_bytes())
    assert again.with_name("grades.diff.csv").read_text(encoding="utf-8").splitlines() == [
        ",".join(regrade.DIFF_COLUMNS)]
    assert "结论改变的检查(0 行)" in again.with_name("grades.html").read_text(encoding="utf-8")


def test_a_changed_check_reruns_its_rows_only_and_the_diff_names_whose_verdict_changed(graded, monkeypatch):
    reference = graded["solutions"] / NAME
    nb = nbformat.read(reference, as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "check-square")
    assert "rng.randint(-30, 30)" in cell.source
    cell.source = cell.source.replace("rng.randint(-30, 30)", "rng.randint(0, 30)")   # the fix: x >= 0 only
    nbformat.write(nb, reference)
    ran = []
    real = kernel._run

    async def counted(plan, *args):
        ran.append(plan.label(plan.checks[0]))
        return await real(plan, *args)

    monkeypatch.setattr(kernel, "_run", counted)
    again = graded["report"].parent.parent / "again" / "grades.csv"
    grades = _regrade(graded, again)
    assert sorted(ran) == ["check-add"] * 3                     # 01's three rows; no 02 row re-ran
    diff = _rows(again.with_name("grades.diff.csv"))
    assert [(d["learner"], d["notebook"], d["check"], d["old"], d["new"]) for d in diff] == [
        ("ben", NAME, "check-square", "0", "1")]
    assert diff[0]["changed"].startswith("version ") and "python" not in diff[0]["changed"]
    assert {(g.learner, g.notebook): g.passed for g in grades}["ben", NAME] == 2
    page = again.with_name("grades.html").read_text(encoding="utf-8")
    assert "结论改变的检查(1 行)" in page and "check-square" in page


def test_a_homework_row_whose_stamp_matches_runs_no_check(tmp_path, monkeypatch):
    reference, baseline, learner = tmp_path / "reference", tmp_path / "baseline", tmp_path / "ann" / "homework"
    for folder in (reference, baseline, learner):
        folder.mkdir(parents=True)
    (reference / "train_cifar.py").write_text("reference\n")
    (learner / "train_cifar.py").write_text("mine\n")
    setup = homework.HomeworkSetup(reference, baseline)
    item = Item("ann", Path(homework.NOTEBOOK), learner, form="folder")
    monkeypatch.setattr(upgrades._Runner, "check",
                        lambda self, upgrade, folder, commit: CheckOutcome(upgrades.upgrade_label(upgrade),
                                                                            upgrade.number != 3, "stand-in"))
    first = homework.grade_homework(item, setup, sandbox=False, private=tmp_path).grade
    assert first.passed == 4 and first.extra["submission"]
    monkeypatch.setattr(upgrades._Runner, "check", lambda *a: pytest.fail("a check ran"))
    old = {first.key: first}
    kept = homework.grade_homework(item, setup, sandbox=False, private=tmp_path, settings={"regrade": old}).grade
    assert kept.row() == first.row() and kept.check_rows() == first.check_rows()
    (reference / UPGRADES[2].scripts[0]).write_text("reference, fixed\n")     # upgrade 3's reference changes
    with pytest.raises(pytest.fail.Exception, match="a check ran"):
        homework.grade_homework(item, setup, sandbox=False, private=tmp_path, settings={"regrade": old})
