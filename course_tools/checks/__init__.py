"""Self-checks for the notebook exercises: one module per notebook, shared helpers here.

A check prints one short ✅ line on success and raises :class:`CheckFailed` (an ``AssertionError``: 期望 / 实际 /
提示). It builds its inputs from fixed seeds, so a constant or edited arguments cannot pass and a wrong answer fails
every time. In Jupyter a failure shows at most four lines (:func:`failure_lines`), not a traceback, and the cell
still errs, so Run All stops there and nbval and the grader count it. An unattempted exercise (:class:`NotStarted`)
is a calm note in a learner's kernel (:func:`exercise_check`, as Kaggle learntools does) and a failure wherever
``COURSE_CHECKS=strict`` is set (:func:`calm`). Outcomes go into the ledger (:mod:`course_tools.ledger`); after a
failure :func:`hint` prints the next tier of the module's ``HINTS``, never the graded answer.

Example (in a check cell)::

    from course_tools.checks.nb02_grad_clipping import check_global_clip
    check_global_clip(my_clip_grad_norm_)
"""
from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable, NoReturn, TypeVar

__all__ = ["EXERCISE_CHECKS", "CheckFailed", "NotStarted", "passed", "expect", "fail", "not_started", "exercise_check",
           "calm", "call_learner", "failure_lines", "hint", "seed_cpu"]

_Check = TypeVar("_Check", bound=Callable[..., Any])
EXERCISE_CHECKS: dict[str, Callable[..., Any]] = {}  # ledger key -> check, filled by @exercise_check on import

_COURSE_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
                     for name in ("course_tools", "course_utils"))
_MAX_FIELD = 400
_last_failed: str | None = None      # ledger key of the check that failed last in this process
_tiers_shown: dict[str, int] = {}    # hint tiers shown in this process (the ledger may be unwritable)


def _current_check() -> str | None:
    """``"nb01_amp.check_amp_train_step"``: the outermost ``check_*`` function of a notebook's check module
    on the stack (a check may call back into the learner's code, which may call a check)."""
    found = None
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(__name__ + ".nb") and frame.f_code.co_name.startswith("check_"):
            found = f"{module.rsplit('.', 1)[1]}.{frame.f_code.co_name}"
        frame = frame.f_back
    return found


def _record(check: str | None, ok: bool | None) -> None:
    """Put one outcome into the progress ledger (None: not started); nothing here can fail the check."""
    if check is None:
        return
    try:
        from course_tools.ledger import record_check

        record_check(check, ok)
    except Exception:  # noqa: BLE001 (the ledger is a convenience: a check's verdict never depends on it)
        pass


class CheckFailed(AssertionError):
    """A check that did not pass. ``str()`` is ``"期望 …;实际 …"`` (plus the hint)."""

    def __init__(self, expected: str, found: str, hint: str = "") -> None:
        global _last_failed
        self.expected, self.found, self.hint = expected, found, hint
        self.check = _current_check()
        if self.check is not None:
            _last_failed = self.check
        super().__init__(f"期望 {expected};实际 {found}" + (f"(提示: {hint})" if hint else ""))


class NotStarted(CheckFailed):
    """An exercise not attempted yet: a failure under ``COURSE_CHECKS=strict``, a calm note in Jupyter."""

    def __init__(self, todo: str, hint: str = "把 raise NotImplementedError 那一行换成你的实现") -> None:
        self.todo = todo
        super().__init__("完成这个练习", f"练习尚未完成: {todo}", hint)


_STRICT = b"COURSE_CHECKS=strict"


@functools.lru_cache(maxsize=1)
def _started_strict() -> bool:
    """Whether this process was started with ``COURSE_CHECKS=strict``: read from ``/proc/self/environ``,
    which code in the kernel cannot rewrite by editing ``os.environ`` (Linux; elsewhere False)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            return _STRICT in f.read().split(b"\0")
    except OSError:
        return False


def calm() -> bool:
    """True in a learner's own Jupyter kernel, where an unstarted exercise does not stop Run All.

    False under ``COURSE_CHECKS=strict`` (every non-interactive run sets it; a kernel started with it
    stays strict whatever its code does to ``os.environ``) and outside a Jupyter kernel (a script,
    plain IPython, pytest).
    """
    if os.environ.get("COURSE_CHECKS", "").strip().lower() == "strict" or _started_strict():
        return False
    shell = sys.modules.get("IPython")
    shell = shell.get_ipython() if shell is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _show_not_started(exc: NotStarted) -> None:
    _record(exc.check, None)
    print(f"⏳ 还没做: {_one_line(exc.todo)}\n   {_one_line(exc.hint)},再运行这一格。"
          "这不是报错:Run All 会继续往下运行;评分时未完成的练习记 0 分。")


def _key(check: Callable[..., Any]) -> str:
    """The ledger key of a check function: ``"nb02_grad_clipping.check_global_clip"``."""
    return f"{check.__module__.rsplit('.', 1)[-1]}.{check.__name__}"


def exercise_check(check: _Check) -> _Check:
    """Decorate a notebook check: in a learner's Jupyter an unstarted exercise prints a calm note and
    the check returns None instead of raising (see :func:`calm`); everything else is unchanged.

    Pitfall: only :class:`NotStarted` is softened; a wrong answer, or a stub under the grader, fails.

    Example::

        @exercise_check
        def check_global_clip(fn, seed: int = 1234) -> None: ...
    """
    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except NotStarted as exc:
            if not calm():
                raise
            _show_not_started(exc)
            return None
    EXERCISE_CHECKS[_key(check)] = run
    return run  # type: ignore[return-value]


def not_started(todo: str, hint: str = "") -> NoReturn:
    """Raise :class:`NotStarted`: what to do, and where (``"升级 2 还没开始:需要 --resume …"``)."""
    raise NotStarted(todo, hint) if hint else NotStarted(todo)


def passed(message: str) -> None:
    """Print the success line of a check and record the pass in the progress ledger."""
    global _last_failed
    print(f"✅ {message}")
    check = _current_check()
    if check is not None and check == _last_failed:
        _last_failed = None
    _record(check, True)


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
        name = getattr(fn, "__name__", "这个函数")
        raise NotStarted(f"{exc or '请先实现这个函数'}(上面练习格子里的 {name})") from None
    except CheckFailed:
        raise  # a check called back from inside the learner's function
    except Exception as exc:  # an AssertionError from torch or the learner's own assert is a crash too
        raise CheckFailed("函数正常运行", f"抛出 {type(exc).__name__}: {exc}", _learner_frame(exc)) from exc


def seed_cpu(seed: int) -> None:
    """Seed torch's default CPU generator with ``seed`` (what ``torch.manual_seed`` does to it), nothing else: how a
    check seeds its hidden cases, built on the CPU (some inside ``torch.random.fork_rng(devices=[])``, nb07).

    Why not ``torch.manual_seed``: it also seeds every GPU generator, which ``fork_rng(devices=[])`` does not restore
    (on a GPU machine a check would reseed the learner's CUDA generators); and while CUDA, XPU and MTIA are not
    initialised (always, on a CPU-only machine) it queues a seed-all for each with the caller's whole stack
    (``traceback.format_stack``, three times): 0.43 ms a call 60 frames deep against 3 us for the CPU generator alone
    (measured 2026-12-04 on the 2-core CPU machine), and a 50-seed sweep seeds 7,000 cases.
    Pitfall: a check that is *about* every generator (``check_set_seed`` scrambling them, ``check_resume_equivalence``
    reseeding like a fresh script) keeps ``torch.manual_seed``.
    """
    import torch  # here, not at the top: the package is imported by checks that need no torch (the quiz)

    torch.default_generator.manual_seed(int(seed))


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
    lines = failure_lines(evalue)
    check = getattr(evalue, "check", None)
    _record(check, None if isinstance(evalue, NotStarted) else False)
    if check is not None and _tiers(check):
        lines[-1] += "(还卡住?运行 hint() 看下一级提示)"
    shell._showtraceback(etype, evalue, lines)


def _tiers(check: str) -> tuple[str, ...]:
    """The hint tiers of ``check`` (a ledger key): its module's ``HINTS`` entry, or none."""
    module_name, _, name = check.partition(".")
    try:
        module = __import__(f"{__name__}.{module_name}", fromlist=["HINTS"])
    except ImportError:
        return ()
    return tuple(getattr(module, "HINTS", {}).get(name, ()))


def _check_keys(check: str | Callable[..., Any]) -> list[str]:
    """Ledger keys a check function or its name may mean (``"check_global_clip"`` or
    ``"nb02_grad_clipping.check_global_clip"``): one, except for a bare name two notebooks share."""
    if callable(check):
        return [_key(check)]
    if "." in check:
        return [check]
    import importlib
    import pkgutil

    found = [f"{info.name}.{check}" for info in pkgutil.iter_modules(__path__)
             if info.name.startswith("nb") and callable(getattr(importlib.import_module(f"{__name__}.{info.name}"),
                                                                check, None))]
    return found or [check]


def hint(check: str | Callable[..., Any] | None = None) -> None:
    """Print the next, more specific hint tier for the check that failed last (or for ``check``).

    Tiers: the concept, the notebook section that teaches it, the line that is usually wrong.
    Each call shows one more; the tiers used go into the progress ledger.
    """
    keys = [_last_failed] if check is None else _check_keys(check)
    if len(keys) > 1:  # a bare name two notebooks share: the one that failed last, else ask
        if _last_failed not in keys:
            print(f"{check} 在几个 notebook 里都有,请写全名: " + "、".join(f'hint("{k}")' for k in keys))
            return
        keys = [_last_failed]
    key = keys[0]
    if key is None:
        print("还没有未通过的检查:先运行练习下面的检查格子;或者写 hint(\"check_函数名\")")
        return
    name = key.rsplit(".", 1)[-1]
    tiers = _tiers(key)
    if not tiers:
        print(f"{name} 还没有分级提示:先读检查消息里的「提示」一行,再回到讲它的那一节")
        return
    from course_tools.ledger import hints_shown, record_hint

    tier = min(max(_tiers_shown.get(key, 0), hints_shown(key)) + 1, len(tiers))
    _tiers_shown[key] = tier
    record_hint(key, tier)
    last = tier == len(tiers)
    print(f"💡 {name} 提示 {tier}/{len(tiers)}: {tiers[tier - 1]}\n"
          + ("(这是最后一级:对照检查消息改这一处,再运行检查)" if last else "(还不够?再运行 hint())"))


def _install_display() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((CheckFailed,), _show_failure)
        shell.user_ns.setdefault("hint", hint)  # hint() works in the notebook without an import


_install_display()
