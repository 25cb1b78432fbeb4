"""What the kill-and-resume experiments of 11 (sections 9 and 10) both end with (reference machinery of
``course_tools.lab.multi_process`` and ``course_tools.lab.hangs``)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ResumedJob"]


@dataclass(frozen=True)
class ResumedJob:
    """What sections 9 and 10 both end with: the uninterrupted run, and the interrupted one after --resume."""

    reference: dict[int, float]        # step -> train loss of the uninterrupted run
    resumed: dict[int, float]          # step -> train loss of the interrupted run after --resume
    returncodes: dict[str, int | None]  # reference, resume
    states: list[str]                  # status.json's state at the end: reference, resumed
    seconds: float
    resume_log: str
