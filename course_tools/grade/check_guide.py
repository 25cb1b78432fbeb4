"""What a learner's feedback page says under a failed check: its first hint tier and how to reproduce it.

Reference machinery for the grader (``course_tools.grade``), not taught; read by
:mod:`course_tools.grade.html_report`. A notebook's check is named in the reports by its cell's label
(:meth:`~course_tools.grade.plan.Plan.label`); its check cell imports a function from a
``course_tools.checks.nbNN_*`` module, whose ``HINTS`` entry holds the hint tiers
(:mod:`course_tools.checks`). A homework upgrade is named ``升级 k: title`` and its tiers are those of
``nb10_homework.HINTS``; its own failure message already ends with the command that reproduces it
(``复现: python ...``). Only tier 1 is shown: it names the concept, never the answer, and the learner
sees the next tiers with ``hint()`` in the notebook.

Why: the feedback should say where to start, not only that a check failed.
Pitfall: a check cell that calls no ``check_*`` of a check module (a fixture, an old reference) has
no hint; the page then shows the message and the reproduce step only.

Example::

    guide = check_guide(released)                      # notebook name -> released reference
    guide.hint("01_amp.ipynb", "check-amp-step")       # '' when the check has no hint tiers
    guide.reproduce("01_amp.ipynb", "check-amp-step", message)
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field

import nbformat

from course_tools.grade.homework import NOTEBOOK as HOMEWORK, upgrade_label
from course_tools.grade.plan import cell_source, make_plan

__all__ = ["REPRODUCE", "Guide", "check_guide"]

REPRODUCE = "复现: "   # where a check message names its own reproduce command


def _check_key(source: str) -> str:
    """``nb01_amp.check_amp_train_step``: the check module function a check cell calls, or ''."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    imported = {alias.asname or alias.name: f"{node.module.rsplit('.', 1)[1]}.{alias.name}"
                for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("course_tools.checks.nb") for alias in node.names}
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return next((imported[name] for name in calls if name in imported and name.startswith("check_")), "")


def _first_tier(key: str) -> str:
    module, _, name = key.partition(".")
    try:
        hints = getattr(importlib.import_module(f"course_tools.checks.{module}"), "HINTS", {})
    except ImportError:
        return ""
    tiers = hints.get(name, ())
    return tiers[0] if tiers else ""


@dataclass
class Guide:
    """(notebook, check label) -> hint tier 1, for the checks of the graded references."""

    hints: dict[tuple[str, str], str] = field(default_factory=dict)

    def hint(self, notebook: str, check: str) -> str:
        """Tier 1 of the check's hints, or '' when it has none."""
        return self.hints.get((notebook, check), "")

    @staticmethod
    def reproduce(notebook: str, check: str, message: str) -> str:
        """How the learner sees the failure again: the message's own command, else the notebook's cells."""
        if REPRODUCE in message:
            return message.rpartition(REPRODUCE)[2].strip()
        return f"打开 notebooks/{notebook},从头运行到检查格子 {check}"


def check_guide(released: dict[str, nbformat.NotebookNode]) -> Guide:
    """The guide for the released references (as :func:`~course_tools.grade.plan.references` returns them)."""
    from course_tools.checks.nb10_homework import HINTS, UPGRADES

    guide = Guide()
    for name, notebook in released.items():
        plan = make_plan(notebook, notebook)
        for index in plan.checks:
            key = _check_key(cell_source(notebook.cells[index]))
            if key and (tier := _first_tier(key)):
                guide.hints[name, plan.label(index)] = tier
    for upgrade in UPGRADES:
        guide.hints[HOMEWORK, upgrade_label(upgrade)] = HINTS[upgrade.check.__name__][0]
    return guide
