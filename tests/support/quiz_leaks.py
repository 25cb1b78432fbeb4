"""Finding graded self-test answers in text a learner reads (hints, messages): used by the 09 and hint tests."""
from __future__ import annotations

import re

from course_tools.checks import nb09_self_test as checks
from course_tools.quiz import check


def literals(text: str) -> list:
    """Every value a learner could copy from ``text``: quoted strings, bare letter groups and numbers."""
    values: list = re.findall(r"[\"“']([^\"”']{1,12})[\"”']", text)
    values += re.findall(r"(?<![A-Za-z])([A-E]{1,5})(?![A-Za-z])", text)
    values += [float(v) for v in re.findall(r"\d+(?:\.\d+)?", text)]
    return values


def graded_hits(text: str) -> list[tuple[str, object]]:
    """The (question, value) pairs in ``text`` that would score a graded self-test question."""
    hits = [(qid, value) for value in literals(text) for qid in checks.GRADED_IDS
            if check(checks.QUIZ.by_id[qid], value).correct]
    hits += [(qid, value) for qid, value in re.findall(r"[\"“']?(q\d+)[\"”']?\s*[::]\s*([^,,}\s]+)", text)
             if qid in checks.QUIZ.by_id and check(checks.QUIZ.by_id[qid], value.strip("\"'“”")).correct]
    return hits
