"""The lines two flagged homework scripts share, for the class report's side-by-side view.

Reference machinery for the grader (``course_tools.grade``), not taught; read by
:mod:`course_tools.grade.html_report`. :mod:`course_tools.grade.similarity` scores a pair on
shingles of normalised tokens; a person then wants to see *where* the scripts agree. Each line is
normalised the same way (:func:`~course_tools.grade.similarity.tokens`: names to ``V``, strings to
``S``, numbers to ``N``, comments and layout dropped), lines that normalise to nothing or that the
shared baseline also has are left out, and :class:`difflib.SequenceMatcher` finds the longest runs of
equal normalised lines. A renamed or reformatted copy therefore still lines up.

Pitfall: this is a view for a person, not the score: a pair can score high on shingles that span
lines in ways no run of whole lines shows, and the view then lists fewer blocks.

Example::

    for block in matched_blocks(alice_source, bob_source, baseline=released_source):
        block.left, block.right          # (first line number, lines) of each script
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from course_tools.grade.similarity import tokens

__all__ = ["Block", "matched_blocks"]


@dataclass(frozen=True)
class Block:
    """One run of matching lines: (first line number, the lines as written) on each side."""

    left: tuple[int, list[str]]
    right: tuple[int, list[str]]


def _normalised(source: str, skip: frozenset[str]) -> list[tuple[int, str]]:
    """(line index, normalised text) of the lines that carry code of the learner's own."""
    out = []
    for index, line in enumerate(source.splitlines()):
        text = " ".join(tokens(line.strip())[0])
        if text and text not in skip:
            out.append((index, text))
    return out


def matched_blocks(a: str, b: str, baseline: str = "", min_lines: int = 3, limit: int = 6) -> list[Block]:
    """The longest runs (at least ``min_lines`` normalised lines) that ``a`` and ``b`` share, longest first."""
    skip = frozenset(text for _, text in _normalised(baseline, frozenset()))
    left, right = _normalised(a, skip), _normalised(b, skip)
    matcher = difflib.SequenceMatcher(None, [t for _, t in left], [t for _, t in right], autojunk=False)
    runs = sorted((m for m in matcher.get_matching_blocks() if m.size >= min_lines), key=lambda m: -m.size)
    lines_a, lines_b = a.splitlines(), b.splitlines()
    blocks = []
    for m in runs[:limit]:
        a0, a1 = left[m.a][0], left[m.a + m.size - 1][0]
        b0, b1 = right[m.b][0], right[m.b + m.size - 1][0]
        blocks.append(Block((a0 + 1, lines_a[a0:a1 + 1]), (b0 + 1, lines_b[b0:b1 + 1])))
    return blocks
