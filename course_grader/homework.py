"""Grade the homework of ``10_homework``: a row per learner, a check row per upgrade, through
:data:`~course_grader.steps.HOMEWORK_STEPS` in a scratch folder of its own. The score counts the upgrades whose
check passes on the scripts handed in; ``--require-commits`` sets it to 0 for a history that fails the commit verdict.

Example::

    sub = grade_homework(item, HomeworkSetup.for_solutions(Path("solutions")), sandbox=True, private=Path(tmp))
"""
from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_grader.collect import Item
from course_grader.commits import HOMEWORK
from course_grader.report import Grade
from course_grader.sandbox import GiB, MiB, Limits
from course_grader.similarity import PRO_REFERENCE, REFERENCE
from course_grader.steps import HOMEWORK_STEPS, Submission, run_steps
from course_grader.upgrades import UPGRADE_LABELS
from course_tools.checks.nb10_homework import TRAIN, UPGRADES

__all__ = ["NOTEBOOK", "HOMEWORK", "HOMEWORK_LIMITS", "HomeworkSetup", "grade_homework"]

NOTEBOOK = "10_homework.ipynb"
# One script run: torch maps ~3.4 GiB of address space, a tiny run stays under 1 GiB resident; a
# run folder holds a few small checkpoints and logs.
HOMEWORK_LIMITS = Limits(memory=6 * GiB, resident=2 * GiB, pids=256, file_size=256 * MiB, disk=512 * MiB,
                         tmp=256 * MiB, shm=256 * MiB, home=64 * MiB)


@dataclass(frozen=True)
class HomeworkSetup:
    """Where the homework's references are: ``reference`` (``solutions/homework``), ``baseline`` (the released
    ``notebooks/homework``), ``course`` (the course repository, for the learner's start; None: from the baseline)."""

    reference: Path
    baseline: Path
    course: Path | None = None
    require_commits: bool = False
    limits: Limits = HOMEWORK_LIMITS

    @classmethod
    def for_solutions(cls, solutions: Path, **kw) -> "HomeworkSetup | None":
        """``solutions/homework`` and ``solutions/../notebooks/homework``; None when there are no reference scripts."""
        solutions = Path(solutions).resolve()
        reference = solutions / "homework"
        if not reference.is_dir():
            return None
        root = solutions.parent
        return cls(reference, root / HOMEWORK, root if (root / ".git").exists() else None, **kw)

    def reference_scripts(self) -> dict[str, dict[str, str]]:
        """The references of :func:`~course_grader.similarity.pair_rows` (``train_cifar_pro.py`` stands for the
        learner's ``train_cifar.py``); a reference with no file is left out."""
        names = dict.fromkeys(n for u in UPGRADES for n in u.scripts)
        paths = {REFERENCE: {name: self.reference / name for name in names},
                 PRO_REFERENCE: {TRAIN: self.reference / "train_cifar_pro.py"}}
        found = {other: {name: path.read_text(encoding="utf-8", errors="replace")
                         for name, path in files.items() if path.is_file()} for other, files in paths.items()}
        return {other: files for other, files in found.items() if files}


def grade_homework(item: Item, setup: HomeworkSetup, *, sandbox: bool, private: Path,
                   settings: dict[str, Any] | None = None) -> Submission:
    """Grade one learner's homework (``item.form``/``item.path`` from the collector); never raises for a bad
    submission. ``settings``: the step modules' own (``Options.steps``)."""
    grade = Grade.fresh(item, len(UPGRADES), sandbox)   # item.reference: NOTEBOOK (the collector's homework row)
    sub = Submission(item, grade, private, sandbox, settings=settings or {}, setup=setup)
    if item.path is None:
        sub.unrun(list(UPGRADE_LABELS), "未提交作业")
        return sub
    sub.scratch = Path(tempfile.mkdtemp(prefix="hw", dir=private))
    try:
        asyncio.run(run_steps(HOMEWORK_STEPS, sub))   # plain functions, in this (worker) thread's own event loop
    finally:
        shutil.rmtree(sub.scratch, ignore_errors=True)
    sub.finish()
    if not sub.final and setup.require_commits and grade.commits.startswith("不合格"):
        grade.notes.append(f"--require-commits: 提交纪律不合格,作业记 0 分(检查本身通过 {grade.passed} 个)")
        grade.passed = 0
    return sub
