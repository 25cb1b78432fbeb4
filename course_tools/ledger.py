"""The learner's progress ledger (reference machinery; :mod:`course_tools.progress` shows it, 00 explains it).

Every check records in one small JSON file on the learner's own machine which check passed, failed or was not
started (its stub ran), when, and how many hint tiers (``course_tools.checks.hint``) were shown; the self-test
(``course_tools.quiz``) records each question's latest verdict. The file is ``$COURSE_PROGRESS`` when set (``off``
or empty: record nothing), else ``notebooks/.progress.json`` of this checkout (ignored by git); nothing is sent
anywhere. Recording never breaks a check: an unwritable folder (the grader's read-only sandbox) is skipped
silently; a corrupt or hand-edited ledger is moved aside (or its bad entries dropped) with a one-line note. Two
kernels writing at once lose nothing: every update holds ``fcntl.lockf`` on ``<ledger>.lock`` around
read-modify-write, and the write is atomic (``course_utils.durable.atomic_write_json``).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows: one kernel at a time is the common case there; the write stays atomic
    fcntl = None  # type: ignore[assignment]

from course_utils.durable import atomic_write_json

__all__ = ["LEDGER_NAME", "NOTEBOOKS", "ledger_path", "load", "record_check", "record_hint", "record_quiz",
           "hints_shown"]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
LEDGER_NAME = ".progress.json"
VERSION = 1
_OFF = ("", "off")
_CHECK_KEY = re.compile(r"^nb\d\d\w*\.check_\w+$")
_noted: set[str] = set()


def ledger_path() -> Path | None:
    """Where the ledger lives: ``$COURSE_PROGRESS``, or ``notebooks/.progress.json``; None when switched off."""
    value = os.environ.get("COURSE_PROGRESS")
    if value is None:
        return NOTEBOOKS / LEDGER_NAME
    if value.strip().lower() in _OFF:
        return None
    return Path(value).expanduser()


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _note(path: Path, what: str) -> None:
    if str(path) not in _noted:  # one line per ledger and process
        _noted.add(str(path))
        print(f"⚠️ 进度记录 {path} {what}", file=sys.stderr)


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "checks": {}, "quizzes": {}}


def _valid_check(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("passed"), bool)
            and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) and entry[k] >= 0
                    for k in ("passes", "failures", "hints")) and isinstance(entry.get("time"), str))


def _valid_quiz(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("answers"), dict)
            and all(isinstance(v, bool) for v in entry["answers"].values())
            and isinstance(entry.get("total"), int) and entry["total"] > 0)


def _read(path: Path, repair: bool) -> dict[str, Any]:
    """The ledger at ``path``; a corrupt one is moved aside (``repair``) or ignored, with a note."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _empty()
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("checks"), dict) \
                or not isinstance(data.get("quizzes"), dict):
            raise ValueError("not a ledger")
    except (ValueError, UnicodeDecodeError):
        if repair:
            aside = path.with_name(path.name + ".corrupt")
            os.replace(path, aside)
            _note(path, f"无法读取,已移到 {aside.name},重新开始记录")
        else:
            _note(path, "无法读取,这次先忽略它")
        return _empty()
    checks = {_current(k): v for k, v in data["checks"].items() if _CHECK_KEY.match(str(k)) and _valid_check(v)}
    quizzes = {k: v for k, v in data["quizzes"].items() if _valid_quiz(v)}
    if len(checks) < len(data["checks"]) or len(quizzes) < len(data["quizzes"]):
        _note(path, "里有看不懂的条目(手改过?),已忽略它们")
    return {"version": VERSION, "checks": checks, "quizzes": quizzes}


RENAMED = {"nb09_quiz": "nb09_self_test"}  # check modules renamed after ledgers were written with the old name


def _current(key: str) -> str:
    """``key`` under its check module's current name (a ledger from before a rename keeps its entries)."""
    module, _, name = key.partition(".")
    return f"{RENAMED.get(module, module)}.{name}"


def load(path: Path | None = None) -> dict[str, Any]:
    """The ledger as a dict (``checks``, ``quizzes``); empty when there is none or it cannot be read."""
    path = path or ledger_path()
    if path is None:
        return _empty()
    try:
        return _read(path, repair=False)
    except OSError:
        return _empty()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.lockf(lock, fcntl.LOCK_UN)


def _update(change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and write the ledger under its lock; skipped silently when it cannot be written."""
    path = ledger_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            data = _read(path, repair=True)
            change(data)
            atomic_write_json(path, data)
    except OSError:  # a read-only folder (the grader's sandbox), a full disk: the check still counts
        pass


def _entry(data: dict[str, Any], check: str) -> dict[str, Any]:
    return data["checks"].setdefault(check, {"passed": False, "passes": 0, "failures": 0, "hints": 0,
                                             "time": _now()})


def record_check(check: str, ok: bool | None) -> None:
    """Record one run of ``check`` (``"nb01_amp.check_amp_train_step"``): passed, failed, or None for an
    exercise not attempted yet (its stub ran: nothing counted, ``last`` says so)."""
    def change(data: dict[str, Any]) -> None:
        entry = _entry(data, check)
        if ok is not None:
            entry["passed"] = entry["passed"] or ok
            entry["passes" if ok else "failures"] += 1
        entry["last"] = {True: "passed", False: "failed", None: "not_started"}[ok]
        entry["time"] = _now()
    _update(change)


def record_hint(check: str, tier: int) -> None:
    """Record that hint tier ``tier`` (1-based) of ``check`` was shown."""
    def change(data: dict[str, Any]) -> None:
        entry = _entry(data, check)
        entry["hints"] = max(entry["hints"], tier)
    _update(change)


def hints_shown(check: str) -> int:
    """The highest hint tier of ``check`` shown so far (0: none)."""
    return int(load()["checks"].get(check, {}).get("hints", 0))


def record_quiz(title: str, answers: dict[str, bool], total: int) -> None:
    """Record the latest verdict of each answered question of the quiz ``title`` (``total`` questions)."""
    def change(data: dict[str, Any]) -> None:
        entry = data["quizzes"].setdefault(title, {"answers": {}, "total": total})
        entry["answers"].update({str(k): bool(v) for k, v in answers.items()})
        entry["total"] = total
        entry["time"] = _now()
    _update(change)
