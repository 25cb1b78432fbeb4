"""Display width of text in a monospace terminal or notebook output: a wide (CJK) character takes two columns.

Used where Chinese text is lined up or wrapped: the hint lines of a released notebook (:mod:`course_tools.release`)
and the tables of :mod:`course_tools.progress`. Its own module because ``progress`` runs in the last cell of every
notebook (``still_open``): importing it must stay cheap, and ``release`` imports nbformat (about 0.9 s, most of it
jsonschema building ``rfc3987_syntax``'s grammars).

Example::

    width("EMA 衰减率")   # 10: four narrow characters, three wide ones
"""
from __future__ import annotations

import unicodedata

__all__ = ["width"]


def width(text: str) -> int:
    """Display columns of ``text``: a wide (CJK) character takes two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
