"""One learner x reference notebook, :class:`Item` to :class:`Grade`, through :data:`.steps.NOTEBOOK_STEPS`.

Example::

    grade = asyncio.run(grade_item(item, released["01_amp.ipynb"], Options(), private_dir()))
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from course_grader.collect import Item
from course_grader.options import Options
from course_grader.plan import check_labels
from course_grader.report import Grade
from course_grader.steps import NOTEBOOK_STEPS, run_steps
from course_grader.submission import Submission

__all__ = ["grade_item"]


async def grade_item(item: Item, released: nbformat.NotebookNode, options: Options, private: Path) -> Grade:
    """Grade one learner x notebook; never raises for a bad submission."""
    grade = Grade(item.learner, item.reference.name, total=len(check_labels(released)), notes=list(item.notes),
                  review=list(item.review))
    if not options.sandbox:
        grade.notes.insert(0, "未沙箱运行(--no-sandbox)")
    sub = Submission(item, grade, private, options.sandbox, options, options.steps, released=released)
    await run_steps(NOTEBOOK_STEPS, sub)
    return sub.finish()
