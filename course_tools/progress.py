"""The learner's progress ledger and dashboard (reference machinery; 00 shows the dashboard).

Every check records its outcome in one small JSON file on the learner's own machine: which
check, passed or failed, when, and how many hint tiers (``course_tools.checks.hint``) were
shown; the self-test (``course_tools.quiz``) records each question's latest verdict. The file
is ``$COURSE_PROGRESS`` when set (``off`` or empty: record nothing), else
``notebooks/.progress.json`` of this checkout (ignored by git). Nothing is ever sent anywhere.

Recording never breaks a check: a folder that cannot be written (the grader's read-only
sandbox) is skipped silently; a corrupt or hand-edited ledger is moved aside (or its bad
entries dropped) with a one-line note, and recording starts afresh. Two kernels writing at
once lose nothing: every update holds ``fcntl.lockf`` on ``<ledger>.lock`` around
read-modify-write, and the write itself is atomic (``course_utils.durable.atomic_write_json``).

``python -m course_tools.progress`` prints the dashboard: per notebook the exercises passed
(counted from the released notebooks' check cells), the self-test score, the homework
upgrades (``course_tools.checks.upgrades.UPGRADE_LIST``) and the next unfinished exercise
with its notebook section; :func:`show` renders the same as HTML in a notebook.
"""
from __future__ import annotations

import contextlib
import datetime
import html
import json
import os
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

try:
    import fcntl
except ImportError:  # Windows: one kernel at a time is the common case there; the write stays atomic
    fcntl = None  # type: ignore[assignment]

from course_tools.cells import CHECK, NOTEBOOK_GLOB, tags
from course_tools.checks.upgrades import UPGRADE_LIST
from course_utils.durable import atomic_write_json

__all__ = ["LEDGER_NAME", "NOTEBOOKS", "ledger_path", "load", "record_check", "record_hint", "record_quiz",
           "hints_shown", "Exercise", "exercises", "Row", "dashboard", "next_exercise", "text", "html_table",
           "show", "main"]

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
    checks = {k: v for k, v in data["checks"].items() if _CHECK_KEY.match(str(k)) and _valid_check(v)}
    quizzes = {k: v for k, v in data["quizzes"].items() if _valid_quiz(v)}
    if len(checks) < len(data["checks"]) or len(quizzes) < len(data["quizzes"]):
        _note(path, "里有看不懂的条目(手改过?),已忽略它们")
    return {"version": VERSION, "checks": checks, "quizzes": quizzes}


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


# ------------------------------------------------------------------ the dashboard

_IMPORT = re.compile(r"from\s+course_tools\.checks\.(nb\d\d\w*)\s+import")
_CALL = re.compile(r"\b(check_\w+)\s*\(")
_MARKUP = re.compile(r"[`*]")


@dataclass(frozen=True)
class Exercise:
    """One checked exercise of a released notebook."""

    notebook: str   # "01_amp"
    check: str      # "nb01_amp.check_amp_train_step", the ledger key
    section: str    # the heading the check cell sits under
    link: str       # "01_amp.ipynb#练习-1…" (relative to notebooks/)


def _anchor(heading: str) -> str:
    """JupyterLab's id for a heading: its text with spaces turned into dashes."""
    return _MARKUP.sub("", heading).strip().replace(" ", "-")


def exercises(folder: Path = NOTEBOOKS) -> list[Exercise]:
    """The exercises of the notebooks in ``folder``, in order: one per check call in a ``check`` cell."""
    found = []
    for path in sorted(folder.glob(NOTEBOOK_GLOB)):
        nb = json.loads(path.read_text(encoding="utf-8"))
        section = ""
        for cell in nb.get("cells", []):
            source = "".join(cell.get("source", []))
            if cell.get("cell_type") == "markdown":
                for line in source.splitlines():
                    if line.startswith("#"):
                        section = line.lstrip("#").strip()
            elif CHECK in tags(cell):
                module = _IMPORT.search(source)
                for name in dict.fromkeys(_CALL.findall(source)) if module else ():
                    found.append(Exercise(path.stem, f"{module.group(1)}.{name}", _MARKUP.sub("", section),
                                          f"{path.name}#{quote(_anchor(section))}"))
    return found


@dataclass(frozen=True)
class Row:
    """One line of the dashboard."""

    notebook: str
    done: int
    total: int
    detail: str


def _homework() -> list[tuple[int, str, str]]:
    """``(number, title, ledger key)`` of each homework upgrade."""
    return [(u.number, u.title, f"nb10_homework.{u.check}") for u in UPGRADE_LIST]


def dashboard(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> list[Row]:
    """Per notebook: exercises passed / total and a detail (hints used, self-test score, upgrades)."""
    ledger = load() if ledger is None else ledger
    checks = ledger["checks"]
    rows = []
    by_notebook: dict[str, list[Exercise]] = {}
    for ex in exercises(folder):
        by_notebook.setdefault(ex.notebook, []).append(ex)
    for notebook, items in by_notebook.items():
        done = sum(bool(checks.get(ex.check, {}).get("passed")) for ex in items)
        hints = sum(int(checks.get(ex.check, {}).get("hints", 0)) for ex in items)
        detail = [f"看过 {hints} 级提示"] if hints else []
        if notebook.startswith("09"):
            for title, quiz in ledger["quizzes"].items():
                detail.append(f"{title}: 答对 {sum(quiz['answers'].values())}/{quiz['total']}")
        rows.append(Row(notebook, done, len(items), ";".join(detail)))
    upgrades = _homework()
    marks = " ".join(f"{number}{'✅' if checks.get(key, {}).get('passed') else '·'}" for number, _, key in upgrades)
    homework = next((p.stem for p in sorted(folder.glob("10_*.ipynb"))), "10_homework")
    rows.append(Row(homework, sum(bool(checks.get(key, {}).get("passed")) for _, _, key in upgrades), len(upgrades),
                    f"作业升级 {marks}"))
    return sorted(rows, key=lambda r: r.notebook)


def next_exercise(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> Exercise | None:
    """The first exercise (in notebook order, then the homework upgrades) not passed yet; None when all are."""
    ledger = load() if ledger is None else ledger
    checks = ledger["checks"]
    for ex in exercises(folder):
        if not checks.get(ex.check, {}).get("passed"):
            return ex
    homework = next((p.name for p in sorted(folder.glob("10_*.ipynb"))), "10_homework.ipynb")
    for number, title, key in _homework():
        if not checks.get(key, {}).get("passed"):
            return Exercise(Path(homework).stem, key, f"作业升级 {number}: {title}", homework)
    return None


def _width(s: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in s)


def _pad(s: str, width: int) -> str:
    return s + " " * (width - _width(s))


def _next_line(ex: Exercise | None) -> str:
    if ex is None:
        return "全部完成:每个练习和作业升级都通过了。"
    return f"下一步: notebooks/{ex.notebook}.ipynb 的「{ex.section}」({ex.check.split('.')[1]})"


def text(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> str:
    """The dashboard as a plain-text table and the next step."""
    ledger = load() if ledger is None else ledger
    head = ("笔记本", "通过", "说明")
    body = [(r.notebook, f"{r.done}/{r.total}", r.detail) for r in dashboard(ledger, folder)]
    widths = [max(_width(row[i]) for row in (head, *body)) for i in range(2)]
    lines = ["  ".join((_pad(row[0], widths[0]), _pad(row[1], widths[1]), row[2])).rstrip() for row in (head, *body)]
    lines.insert(1, "-" * (sum(widths) + 8))
    path = ledger_path()
    lines += ["", _next_line(next_exercise(ledger, folder)),
              f"(记录在 {path},只在你的电脑上)" if path else "(进度记录已关闭: COURSE_PROGRESS=off)"]
    return "\n".join(lines)


def html_table(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> str:
    """The dashboard as plain HTML: a table and a link to the next unfinished exercise's section."""
    ledger = load() if ledger is None else ledger
    esc = html.escape
    rows = "".join(f"<tr><td><a href=\"{esc(r.notebook)}.ipynb\">{esc(r.notebook)}</a></td>"
                   f"<td>{r.done}/{r.total}</td><td>{esc(r.detail)}</td></tr>" for r in dashboard(ledger, folder))
    ex = next_exercise(ledger, folder)
    if ex is None:
        after = f"<p class=\"next\">{esc(_next_line(None))}</p>"
    else:
        after = (f"<p class=\"next\">下一步: <a href=\"{esc(ex.link)}\">{esc(ex.notebook)} 的「{esc(ex.section)}」</a>"
                 f"({esc(ex.check.split('.')[1])})</p>")
    return ("<div class=\"course-progress\"><table><thead><tr><th>笔记本</th><th>通过</th><th>说明</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>{after}</div>")


def show() -> None:
    """Display the dashboard in a notebook (plain HTML; re-run the cell to refresh it)."""
    from IPython.display import HTML, display

    display(HTML(html_table()))


def main() -> None:
    print(text())


if __name__ == "__main__":
    main()
