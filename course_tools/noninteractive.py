"""The environment of every non-interactive run: the test suite, the grader, homework checks, ``release --execute``.

``COURSE_FAST=1`` shrinks data and step counts (same code path); wandb stays offline and
silent, so nothing reaches the network and no login prompt blocks a run; ``COURSE_PROGRESS=off``
keeps tests, grading and releases out of the learner's progress ledger (``course_tools.ledger``);
``COURSE_CHECKS=strict`` makes an unfinished exercise a failed check there, never the calm "还没做" note a
learner's own Jupyter shows (``course_tools.checks.exercise_check``).

Example::

    subprocess.run(cmd, env=quiet_environ())             # keeps values the caller already set
    env = quiet_environ({}, override=True)               # exactly the quiet values, nothing inherited
"""
from __future__ import annotations

import os
from typing import Mapping

__all__ = ["QUIET", "quiet_environ"]

QUIET: dict[str, str] = {"COURSE_FAST": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                         "COURSE_PROGRESS": "off", "COURSE_CHECKS": "strict"}


def quiet_environ(base: Mapping[str, str] | None = None, *, override: bool = False) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with the quiet settings added.

    ``override=False`` keeps a value the caller already chose (a learner's ``COURSE_FAST=0``);
    ``override=True`` forces the quiet values (grading: every learner runs the same sizes).
    """
    env = dict(os.environ if base is None else base)
    return {**env, **QUIET} if override else {**QUIET, **env}
