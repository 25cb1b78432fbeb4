"""The grader's pipeline as code: the ordered steps of a notebook and of the homework (nbgrader's idea).

Each step is one module with ``step(sub)`` over one :class:`Submission`, the record a submission carries through
the steps: what was handed in, the row being built (its stamp in ``grade.extra``) and what one step leaves for a
later one. A step that settles the row sets ``sub.done``. Adding a step: one module, one list entry. A step module
may also define ``add_arguments(parser)`` / ``read_arguments(args, parser)`` (its flags; the value in
``options.steps[<module>]``), ``ROW_COLUMNS`` / ``CHECK_COLUMNS`` (report columns from ``grade.extra`` /
``check.extra``) and ``finish(report, grades, settings) -> str`` (run once at the end; an HTML section for
``grades.html``).

Example::

    sub = Submission(item, Grade(item.learner, item.reference.name, total=2), private=Path(tmp))
    await run_steps(NOTEBOOK_STEPS, sub)      # the kernel step is async
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from course_grader import answers, discipline, hand_in, kernel, plan, regrade, scan, upgrades
from course_grader.collect import Item
from course_grader.report import CheckOutcome, Grade

if TYPE_CHECKING:
    import nbformat

    from course_grader.homework import HomeworkSetup
    from course_grader.kernel import CellResult
    from course_grader.pipeline import Options
    from course_grader.plan import Plan

__all__ = ["Submission", "NOTEBOOK_STEPS", "HOMEWORK_STEPS", "run_steps", "hooks"]


@dataclass
class Submission:
    """One learner x notebook or homework while the steps run (``done``: above); ``settings``: ``options.steps``;
    ``scratch``: the homework's folder; ``check_extra``: label -> its extra columns; ``final``: the row is complete."""

    item: Item
    grade: Grade
    private: Path
    sandbox: bool = True
    options: Options | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    released: nbformat.NotebookNode | None = None
    setup: HomeworkSetup | None = None
    scratch: Path | None = None
    plan: Plan | None = None
    stubbed: dict[int, str] = field(default_factory=dict)
    outcomes: dict[int, CellResult] = field(default_factory=dict)
    ended: str = ""
    history: Any = None
    runner: Any = None
    head: Path | None = None
    scripts: dict[str, str] = field(default_factory=dict)
    runs: int = 0
    check_extra: dict[str, dict[str, str]] = field(default_factory=dict)
    done: bool = False
    final: bool = False

    def unrun(self, labels: list[str], reason: str) -> None:
        """Every check of the row failed with ``reason`` (nothing ran), and the later steps skipped."""
        self.grade.checks = [CheckOutcome(label, False, reason) for label in labels]
        self.done = True

    def finish(self) -> Grade:
        """The row: ``passed`` counted from the checks, each check given its ``check_extra`` columns."""
        if not self.final:
            self.grade.passed = sum(c.passed for c in self.grade.checks)
            for check in self.grade.checks:
                check.extra.update(self.check_extra.get(check.check, {}))
        return self.grade


Step = Callable[[Submission], Any]

NOTEBOOK_STEPS: tuple[Step, ...] = (regrade.step, plan.step, scan.step, kernel.step, answers.step)
HOMEWORK_STEPS: tuple[Step, ...] = (hand_in.step, regrade.step, upgrades.step, discipline.step)


async def run_steps(steps: tuple[Step, ...], sub: Submission) -> Submission:
    """Run ``steps`` in order on ``sub`` (awaiting the async ones) until one sets ``sub.done``."""
    for step in steps:
        if sub.done:
            break
        result = step(sub)
        if inspect.isawaitable(result):
            await result
    return sub


def hooks(name: str) -> dict[str, Any]:
    """Short module name -> attribute ``name`` of each step module that defines it (both lists', once, in order)."""
    modules = dict.fromkeys(sys.modules[s.__module__] for s in NOTEBOOK_STEPS + HOMEWORK_STEPS)
    return {m.__name__.rsplit(".", 1)[1]: getattr(m, name) for m in modules if hasattr(m, name)}
