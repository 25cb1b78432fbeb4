"""The settings of one grading run (:class:`Options`): filled in by :mod:`.cli`, read by the pipeline and steps."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from course_grader.homework import HOMEWORK_LIMITS
from course_grader.sandbox import Limits

__all__ = ["Options"]


@dataclass
class Options:
    """How notebooks are run. ``cell_timeout``, ``timeout``: CPU seconds per cell and per notebook (all its
    runs), each with a wall-clock backstop of ``WALL_FACTOR`` times that; ``grace``: seconds (wall) a cell
    gets to stop after its interrupt; ``steps``: the step modules' own settings, by module name
    (:func:`course_grader.steps.hooks`)."""

    cell_timeout: float = 120.0
    timeout: float = 900.0
    grace: float = 10.0
    jobs: int = 1
    sandbox: bool = True
    limits: Limits = field(default_factory=Limits)
    run_flagged: bool = False
    homework: bool = True
    require_commits: bool = False
    homework_limits: Limits = HOMEWORK_LIMITS
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        """Torch/OpenMP threads per kernel: the cores shared between the parallel kernels."""
        return max(1, (os.cpu_count() or 1) // self.jobs) if self.jobs > 1 else 0
