"""The grader's commit walk reads ``notebooks/homework/`` only: the learner's notebook changes neither break it
nor change its verdict (issue 33).

A learner commits the chapter notebooks too (solved exercises, saved outputs, a plot too big to export). Two
twin clones of the same stand-in course, one also carrying those changes (in the upgrade commits and in
commits of their own), go through the real walk (``course_grader.discipline._discipline``: which commits
touch the homework, the first passing commit per upgrade, the exported scripts, the verdict). No training: the
upgrade check is a stand-in that reads the exported script.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

from course_grader import discipline, upgrades
from course_grader.commits import HOMEWORK, History, open_history
from course_grader.report import CheckOutcome
from tests.support.git_history import BASELINE, commit_file, git, upgrade

UPGRADED = 4      # the learner's clone: upgrades 1-4 committed one by one, upgrade 5 not done


def _notebook(outputs: int, png_bytes: int = 0) -> str:
    """A notebook with saved stream outputs and, optionally, a base64 PNG of about ``png_bytes``."""
    cells = [{"cell_type": "code", "metadata": {}, "source": f"print({k})", "execution_count": k,
              "outputs": [{"output_type": "stream", "name": "stdout", "text": f"{k}\n"}]} for k in range(outputs)]
    if png_bytes:
        image = base64.b64encode(b"\x89PNG" + bytes(png_bytes)).decode()
        cells[0]["outputs"].append({"output_type": "display_data", "metadata": {}, "data": {"image/png": image}})
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _learner(course: Path, where: Path, notebooks: bool) -> Path:
    """The learner's clone; with ``notebooks`` every upgrade commit also saves a chapter notebook, and
    notebook-only commits come before, between and after the upgrades."""
    git(course.parent, "clone", "-q", str(course), str(where))
    if notebooks:
        commit_file(where, "notebooks/01_amp.ipynb", _notebook(3), "run 01 with outputs")
    for k in range(1, UPGRADED + 1):
        if notebooks:
            (where / "notebooks" / "10_homework.ipynb").write_text(_notebook(k), encoding="utf-8")
            git(where, "add", "notebooks/10_homework.ipynb")
        upgrade(where, k)
        if notebooks and k == 2:
            commit_file(where, "notebooks/06_monitoring.ipynb", _notebook(2, png_bytes=2 ** 21), "06: a big plot")
    if notebooks:
        git(where, "rm", "-q", "notebooks/01_amp.ipynb")
        git(where, "commit", "-q", "-m", "drop my 01 copy")
    return where


def _walk(history: History, scratch: Path) -> tuple[tuple, tuple[str, ...], dict[str, dict[str, str]]]:
    """The real walk with a stand-in check: the verdict (hashes shown as subjects), the subjects of the commits
    that touch the homework, and the exported files of every commit the walk checked, by subject."""
    runner = upgrades._Runner(None, False, scratch, history)

    def check(upgrade, folder: Path, commit: str) -> CheckOutcome:
        runner.runs += 1
        script = (folder / "train_cifar.py").read_text(encoding="utf-8")
        return CheckOutcome(f"升级 {upgrade.number}", f"# upgrade {upgrade.number}\n" in script)

    runner.check = check
    runner.started = lambda upgrade, commit: True   # the --help cut needs real flags: tests/test_grade_homework.py
    verdict = discipline._discipline(runner, history)
    subject = {c.sha: c.subject for c in [history.start, *history.commits]}
    notes = verdict.notes[1:]                              # [0]: the start note names the course commit
    for sha, name in subject.items():
        notes = [note.replace(sha[:7], name) for note in notes]
    exported = {subject[sha]: {str(p.relative_to(folder)): p.read_text(encoding="utf-8")
                               for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts}
                for sha, folder in runner.folders.items()}
    touching = tuple(c.subject for c in history.commits if history.touches_homework(c))
    return (verdict.ok, verdict.column, notes, history.refused), touching, exported


def test_notebook_changes_in_the_learners_commits_change_nothing_in_the_walk(tmp_path: Path) -> None:
    course = tmp_path / "course"
    course.mkdir()
    git(course, "init", "-q")
    commit_file(course, f"{HOMEWORK}/train_cifar.py", BASELINE, "course: homework baseline")
    commit_file(course, "notebooks/10_homework.ipynb", _notebook(0), "course: notebooks")
    plain, noisy = (open_history(_learner(course, tmp_path / name, notebooks), tmp_path / f"s-{name}", course=course)
                    for name, notebooks in (("plain", False), ("noisy", True)))
    assert len(noisy.commits) == len(plain.commits) + 3       # the twin really has notebook-only commits
    walked = _walk(plain, tmp_path / "w-plain")
    assert walked == _walk(noisy, tmp_path / "w-noisy")
    verdict, touching, exported = walked
    assert verdict[:2] == (True, f"合格: {UPGRADED} 个升级各自一个提交, 顺序正确") and not verdict[3]
    assert touching == tuple(f"upgrade {k}: feature {k}" for k in range(1, UPGRADED + 1))
    assert exported and all(list(files) == ["train_cifar.py"] for files in exported.values())
