"""What marks a workbook notebook and its cells: the one definition the release, the grader and the
progress ledger read (CONTRIBUTING.md explains the tags to authors).

- ``NOTEBOOK_GLOB``: the chapter's notebooks, ``NN_name.ipynb`` (and ``NNb_name.ipynb``, the second part of
  notebook NN, which sorts between NN and the next number), in ``solutions/`` and ``notebooks/`` alike.
- ``EXERCISE``: a code cell the learner fills in (the grader takes only these from a submission).
- ``CHECK``: a code cell that calls the exercise's check (the grader runs the reference's copy).
- ``SOLUTION_ONLY``: a cell the learner copy leaves out.

A malformed notebook (metadata that is not a dict, tags that are not strings) has no tags: these
files come from learners, so nothing here may raise on them.
"""
from __future__ import annotations

from typing import Any

__all__ = ["NOTEBOOK_GLOB", "EXERCISE", "CHECK", "SOLUTION_ONLY", "tags", "tagged"]

NOTEBOOK_GLOB = "[0-9][0-9]*_*.ipynb"   # NN_name, and NNb_name for a part of chapter NN
EXERCISE, CHECK, SOLUTION_ONLY = "exercise", "check", "solution-only"


def tags(cell: Any) -> list[str]:
    """The string tags of ``cell`` (a notebook cell as a dict), [] when it has none or they are malformed."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("tags") if isinstance(metadata, dict) else None
    return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []


def tagged(cell: Any, tag: str) -> bool:
    """Whether ``cell`` is a code cell carrying ``tag``."""
    return isinstance(cell, dict) and cell.get("cell_type") == "code" and tag in tags(cell)
