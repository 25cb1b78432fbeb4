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
SKIP = {"10_homework.ipynb"}  # its checks run the learner's scripts: the last test here, tests/test_homework*.py


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


def test_the_homework_page_starts_calm(monkeypatch, tmp_path):
    """10 on the untouched baseline, in a learner's kernel: five calm notes naming each upgrade and what it
    needs, found from the script's --help or the missing file, never from a training run."""
    page = nbformat.read(NOTEBOOKS / "10_homework.ipynb", as_version=4)
    cells = [c for c in page.cells if c.cell_type == "code"]
    setup, checks = cells[0], [c for c in cells if c.source.startswith("check_")]
    assert len(checks) == 5
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.source) for c in [setup, *checks]])
    monkeypatch.delenv("COURSE_CHECKS", raising=False)
    monkeypatch.setenv("COURSE_PROGRESS", str(tmp_path / "ledger.json"))
    NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    texts = ["".join(o.get("text", "") for o in c.outputs if o.output_type == "stream") for c in nb.cells[1:]]
    assert [any(o.output_type == "error" for o in c.outputs) for c in nb.cells[1:]] == [False] * 5, texts
    for number, text in enumerate(texts, 1):
        assert f"⏳ 还没做: 升级 {number} 还没开始" in text, text
    assert "--out --seed --max-steps" in texts[0] and "--clip" in texts[2] and "debug_overfit.py" in texts[4]
    assert not any("unrecognized arguments" in text for text in texts)  # no training run reached argparse


def test_a_started_upgrade_or_an_unclear_help_runs_the_check_as_usual(monkeypatch, tmp_path):
    from course_tools.checks import NotStarted
    from course_tools.checks.homework_started import listed_flags, started

    def script(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text(body)
        return path

    parser = "import argparse\np = argparse.ArgumentParser()\n"
    begun = script("begun.py", parser + "p.add_argument('--out')\np.add_argument('--seed')\np.parse_args()\n")
    baseline = script("baseline.py", parser + "p.add_argument('--epochs')\np.add_argument('--clip-grad')\np.parse_args()\n")
    garbage = script("garbage.py", "print('hello')\n")
    hangs = script("hangs.py", "import time\ntime.sleep(600)\n")
    assert listed_flags(begun, ("--out", "--seed", "--model")) == {"--out", "--seed"}
    assert listed_flags(baseline, ("--clip",)) == set()                 # --clip-grad is not --clip
    assert listed_flags(garbage, ("--out",)) is None and listed_flags(hangs, ("--out",), timeout=2) is None
    monkeypatch.setattr("course_tools.checks.homework_started.calm", lambda: True)
    assert started(begun, 1) == begun.resolve()                          # started: the check runs as now
    assert started(garbage, 1) == garbage.resolve()                      # unclear: the check runs as now
    with pytest.raises(NotStarted, match="升级 3 还没开始"):
        started(baseline, 3)
    with pytest.raises(NotStarted, match="还没有 missing.py"):
        started(tmp_path / "missing.py", 5)
    monkeypatch.setattr("course_tools.checks.homework_started.calm", lambda: False)
    assert started(baseline, 3) == baseline.resolve()                    # strict: nothing here runs
