"""Self-checks for the notebook exercises: one module per notebook, shared helpers here.

A check prints one short ✅ line on success and raises ``AssertionError`` with a
Chinese message saying what was expected and what was found. Checks build their
own inputs (fresh seeds, random shapes), so returning a constant or editing the
check cell's arguments does not make them pass.

Example (in a check cell)::

    from course_tools.checks.nb02_clipping import check_global_clip
    check_global_clip(my_clip)
"""
from __future__ import annotations

from typing import Any, Callable


__all__ = ["passed", "expect", "call_learner"]


def passed(message: str) -> None:
    """Print the success line of a check."""
    print(f"✅ {message}")


def expect(condition: bool, expected: str, found: str) -> None:
    """Raise ``AssertionError('期望 ...;实际 ...')`` unless ``condition`` holds."""
    if not condition:
        raise AssertionError(f"期望 {expected};实际 {found}")


def call_learner(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function, turning an unfinished stub or a crash into a clear AssertionError."""
    if not callable(fn):
        raise AssertionError(f"期望传入一个函数;实际是 {type(fn).__name__}")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise AssertionError(f"练习尚未完成: {exc or '请先实现这个函数'}") from None
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"期望函数正常运行;实际抛出 {type(exc).__name__}: {exc}") from exc
