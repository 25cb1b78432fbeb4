"""The grader's pipeline as code: the ordered steps of a notebook and of the homework (nbgrader's idea).

Each step is one module with ``step(sub)`` over one :class:`~course_grader.submission.Submission`; a step that
settles the row sets ``sub.done``. Adding a step: one module, one list entry. A step module may also define
``add_arguments(parser)`` / ``read_arguments(args, parser)`` (its flags; the value in ``options.steps[<module>]``),
``ROW_COLUMNS`` / ``CHECK_COLUMNS`` (report columns from ``grade.extra`` / ``check.extra``) and
``finish(report, grades, settings) -> str`` (run once at the end; an HTML section for ``grades.html``).

Example::

    await run_steps(NOTEBOOK_STEPS, sub)      # the kernel step is async
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from course_grader import answers, discipline, hand_in, kernel, plan, regrade, scan, upgrades
from course_grader.submission import Submission

__all__ = ["NOTEBOOK_STEPS", "HOMEWORK_STEPS", "run_steps", "run_steps_sync", "hooks"]

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


def run_steps_sync(steps: tuple[Step, ...], sub: Submission) -> Submission:
    """:func:`run_steps` for lists of plain functions (the homework's, run in a worker thread)."""
    for step in steps:
        if sub.done:
            break
        step(sub)
    return sub


def hooks(name: str) -> dict[str, Any]:
    """Short module name -> the attribute ``name`` of each step module (both lists', each once, in order) that
    defines it."""
    modules = dict.fromkeys(sys.modules[s.__module__] for s in NOTEBOOK_STEPS + HOMEWORK_STEPS)
    return {m.__name__.rsplit(".", 1)[1]: getattr(m, name) for m in modules if hasattr(m, name)}
