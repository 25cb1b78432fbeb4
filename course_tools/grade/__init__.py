"""The grader as a package (instructor tool): ``python -m course_tools.grade``; see :mod:`course_tools.grade.pipeline`."""
from __future__ import annotations

from course_tools.grade.pipeline import ROOT, Options, _shard, grade_all, grade_item, main

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]
