"""Self-checks for the notebook exercises: one module per notebook, shared helpers here.

A check prints one short ✅ line on success and raises :class:`CheckFailed` (an
``AssertionError``) with a Chinese message: what was expected, what was found, and a
hint. Checks build their own inputs from fixed seeds, so returning a constant or
editing the check cell's arguments does not make them pass, and a wrong answer fails
every time, not by luck.

In Jupyter a failed check shows at most four lines (❌ 检查未通过 / 期望 / 实际 / 提示)
instead of a traceback through the course packages; the cell still ends in an error,
so "Run All" stops there and nbval and the grader count it as failed.

Example (in a check cell)::

    from course_tools.checks.nb02_grad_clipping import check_global_clip
    check_global_clip(my_clip_grad_norm_)
"""
from __future__ import annotations

import os
import traceback
from typing import Any, Callable

__all__ = ["CheckFailed", "passed", "expect", "fail", "call_learner", "failure_lines"]

_COURSE_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
                     for name in ("course_tools", "course_utils"))
_MAX_FIELD = 400


class CheckFailed(AssertionError):
    """A check that did not pass. ``str()`` is ``"期望 …;实际 …"`` (plus the hint)."""

    def __init__(self, expected: str, found: str, hint: str = "") -> None:
        self.expected, self.found, self.hint = expected, found, hint
        super().__init__(f"期望 {expected};实际 {found}" + (f"(提示: {hint})" if hint else ""))


def passed(message: str) -> None:
    """Print the success line of a check."""
    print(f"✅ {message}")


def fail(expected: str, found: str, hint: str = "") -> None:
    """Raise :class:`CheckFailed`."""
    raise CheckFailed(expected, found, hint)


def expect(condition: bool, expected: str, found: str, hint: str = "") -> None:
    """Raise :class:`CheckFailed` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(expected, found, hint)


def _learner_frame(exc: BaseException) -> str:
    """``第 N 行: <code>`` of the innermost frame outside the course packages and site-packages."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_COURSE_DIRS) and "site-packages" not in f.filename
              and "dist-packages" not in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    code = (frame.line or "").strip()
    return f"出错位置: 你的代码第 {frame.lineno} 行" + (f" `{code}`" if code else "")


def call_learner(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function, turning an unfinished stub or a crash into a :class:`CheckFailed`."""
    if not callable(fn):
        raise CheckFailed("传入一个函数", f"{type(fn).__name__}", "check 格子里传的是函数名本身,不要加括号")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise CheckFailed("完成这个练习", f"练习尚未完成: {exc or '请先实现这个函数'}",
                          "把 raise NotImplementedError 那一行换成你的实现") from None
    except CheckFailed:
        raise  # a check called back from inside the learner's function
    except Exception as exc:  # an AssertionError from torch or the learner's own assert is a crash too
        raise CheckFailed("函数正常运行", f"抛出 {type(exc).__name__}: {exc}", _learner_frame(exc)) from exc


def _one_line(text: str) -> str:
    text = " | ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return text if len(text) <= _MAX_FIELD else text[:_MAX_FIELD - 1] + "…"


def failure_lines(exc: BaseException) -> list[str]:
    """The (at most four) lines shown for a failed check."""
    if isinstance(exc, CheckFailed):
        lines = [f"期望: {_one_line(exc.expected)}", f"实际: {_one_line(exc.found)}"]
        if exc.hint:
            lines.append(f"提示: {_one_line(exc.hint)}")
    else:
        lines = [_one_line(str(exc))]
    return ["\x1b[1;31m❌ 检查未通过\x1b[0m", *lines]


def _show_failure(shell: Any, etype: type, evalue: BaseException, tb: Any, tb_offset: Any = None) -> None:
    # An IPython custom exception handler: an error message whose "traceback" is just our lines.
    # The execute reply stays "error", so Run All stops and nbval / the grader see a failure.
    shell._showtraceback(etype, evalue, failure_lines(evalue))


def _install_display() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((CheckFailed,), _show_failure)


_install_display()
