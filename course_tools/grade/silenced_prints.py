"""What the homework checks print while the grader runs them: dropped per grading thread (instructor tool).

The checks print their ✅ lines for a learner in Jupyter. In the grader, several learners are graded in
threads at once (``--jobs``) and the terminal must show only the grader's own table and progress, so
:func:`quiet_checks` drops what is printed in the calling thread, and only there.

Example::

    with quiet_checks():
        message = upgrade.run(folder, launcher=box, workdir=work)
"""
from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator

__all__ = ["quiet_checks"]


class _ThreadStdout(io.TextIOBase):
    """``sys.stdout`` while homework is graded: what the checks print in a grading thread is dropped."""

    def __init__(self, real) -> None:
        self.real = real
        self.local = threading.local()

    def write(self, text: str) -> int:
        return len(text) if getattr(self.local, "quiet", False) else self.real.write(text)

    def flush(self) -> None:
        self.real.flush()


_STDOUT: list[_ThreadStdout] = []


@contextlib.contextmanager
def quiet_checks() -> Iterator[None]:
    """Drop what the checks print (their passed lines) in this thread; the terminal keeps the grader's output."""
    if not _STDOUT or sys.stdout is not _STDOUT[0]:
        _STDOUT[:] = [_ThreadStdout(sys.stdout)]
        sys.stdout = _STDOUT[0]
    proxy = _STDOUT[0]
    proxy.local.quiet = True
    try:
        yield
    finally:
        proxy.local.quiet = False
