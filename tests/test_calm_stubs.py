"""An exercise not attempted yet: a calm note in the learner's Jupyter, a failed check everywhere else.

Runs every released stub and its check cell in a real Jupyter kernel, once as a learner's own kernel
(no ``COURSE_CHECKS``: every check cell ends "ok" with the "⏳ 还没做" note, so Run All goes on, and
the ledger says ``not_started``) and once as the grader and nbval run it (``COURSE_CHECKS=strict``:
every check cell is an error, as a wrong answer is, even after the kernel's code removed the variable).
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_tools.cells import CHECK, EXERCISE, NOTEBOOK_GLOB, tags
from course_tools.checks import EXERCISE_CHECKS, calm, exercise_check, not_started
from course_tools.progress import exercises

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SKIP = {"10_homework.ipynb"}  # its checks run the learner's scripts: tests/test_homework*.py


def _stub_notebook() -> tuple[nbformat.NotebookNode, list[str]]:
    """Every learner notebook's exercise and check cells, in order, in one notebook; and each check
    cell's label."""
    cells, labels = [], []
    for path in sorted(NOTEBOOKS.glob(NOTEBOOK_GLOB)):
        if path.name in SKIP:
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and ({EXERCISE, CHECK} & set(tags(cell))):
                cells.append(nbformat.v4.new_code_cell(cell.source, metadata={"tags": tags(cell)}))
                if CHECK in tags(cell):
                    labels.append(f"{path.stem}: {cell.source.splitlines()[-1]}")
    return nbformat.v4.new_notebook(cells=cells), labels


def _run(monkeypatch, tmp_path: Path, strict: bool) -> list[tuple[str, str, str]]:
    """(label, status, text) of each check cell after running the stub notebook in a kernel."""
    nb, labels = _stub_notebook()
    if strict:  # the kernel starts strict; its code then tries to switch the calm mode on
        monkeypatch.setenv("COURSE_CHECKS", "strict")
        nb.cells.insert(0, nbformat.v4.new_code_cell('import os\nos.environ.pop("COURSE_CHECKS")'))
    else:
        monkeypatch.delenv("COURSE_CHECKS", raising=False)
    monkeypatch.setenv("COURSE_PROGRESS", str(tmp_path / "ledger.json"))
    NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    found = []
    for cell in (c for c in nb.cells if CHECK in tags(c)):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        found.append((labels[len(found)], "error" if errors else "ok", errors[0].ename if errors else text))
    return found


def test_stubs_are_calm_in_a_learners_kernel_and_fail_when_strict(monkeypatch, tmp_path):
    calm_run = _run(monkeypatch, tmp_path, strict=False)
    assert calm_run and all(status == "ok" and "⏳ 还没做" in text for _, status, text in calm_run), \
        [r for r in calm_run if r[1] != "ok" or "⏳ 还没做" not in r[2]]
    ledger = json.loads((tmp_path / "ledger.json").read_text(encoding="utf-8"))["checks"]
    expected = {ex.check for ex in exercises() if ex.notebook + ".ipynb" not in SKIP}
    assert set(ledger) == expected
    assert {e["last"] for e in ledger.values()} == {"not_started"}
    assert all(e["passes"] == e["failures"] == 0 and not e["passed"] for e in ledger.values())

    strict_run = _run(monkeypatch, tmp_path, strict=True)
    assert [(label, status, text) for label, status, text in strict_run] == \
        [(label, "error", "NotStarted") for label, _, _ in calm_run]


def test_every_exercise_check_is_decorated():
    """A check left undecorated would stop Run All on its stub: every check cell's call is registered."""
    import importlib

    for ex in exercises():
        module, name = ex.check.split(".")
        importlib.import_module(f"course_tools.checks.{module}")
        assert ex.check in EXERCISE_CHECKS, f"{ex.check}: add @exercise_check"


def test_only_not_started_is_softened(monkeypatch):
    """In calm mode a wrong answer still raises; outside Jupyter (here) calm mode is off."""
    from course_tools.checks import CheckFailed, NotStarted, fail

    assert not calm()  # pytest is no Jupyter kernel

    @exercise_check
    def check_wrong() -> None:
        fail("1", "2")

    @exercise_check
    def check_unstarted() -> None:
        not_started("练习 X")

    monkeypatch.setattr("course_tools.checks.calm", lambda: True)
    with pytest.raises(CheckFailed):
        check_wrong()
    assert check_unstarted() is None
    monkeypatch.setattr("course_tools.checks.calm", lambda: False)
    with pytest.raises(NotStarted):
        check_unstarted()
