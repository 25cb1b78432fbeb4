"""The learner's dashboard (reference machinery; 00 shows it): per notebook the exercises passed
(counted from the released notebooks' check cells) and those in progress or passed-then-failed, the
self-test score over its scored questions, the homework upgrades
(``course_tools.checks.upgrades.UPGRADE_LIST``) and where to go next: the exercise the learner is stuck
on, else the first one not started, with its notebook section. Read from the ledger
(:mod:`course_tools.ledger`); ``python -m course_tools.progress`` prints it, :func:`show` renders it
as HTML in a notebook.

It also measures text as a monospace terminal or notebook output shows it (:func:`width`: a wide, CJK character
takes two columns), for its tables and for the hint lines :mod:`course_tools.release` wraps. Here, not in
``release``: this module runs in the last cell of every notebook (``still_open``), so importing it must stay cheap,
and ``release`` imports nbformat (about 0.9 s, most of it jsonschema building ``rfc3987_syntax``'s grammars).
"""
from __future__ import annotations

import html
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from course_tools.cells import CHECK, NOTEBOOK_GLOB, tags
from course_tools.checks.upgrades import UPGRADE_LIST
from course_tools.ledger import NOTEBOOKS, ledger_path, load

__all__ = ["STATES", "state", "Exercise", "exercises", "Row", "dashboard", "next_exercise", "still_open", "text",
           "html_table", "show", "main", "width"]

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


STATES = {"not_started": "未开始", "in_progress": "进行中", "passed": "已通过", "regressed": "通过后又失败"}


def state(entry: dict[str, Any] | None) -> str:
    """One exercise's state from its ledger entry: a key of :data:`STATES`.

    Passed once and failed on the last run is ``regressed`` (the ledger keeps ``passed``; the learner
    should know the cell no longer passes); failures or hints seen without a pass are ``in_progress``.
    """
    if not entry:
        return "not_started"
    if entry.get("passed"):
        return "regressed" if entry.get("last") == "failed" else "passed"
    return "in_progress" if entry.get("failures") or entry.get("hints") else "not_started"


def _attempts(entry: dict[str, Any] | None) -> str:
    """``失败 3 次,看过 2 级提示`` (empty when neither)."""
    entry = entry or {}
    parts = ([f"失败 {entry['failures']} 次"] if entry.get("failures") else []) + \
        ([f"看过 {entry['hints']} 级提示"] if entry.get("hints") else [])
    return ",".join(parts)


@dataclass(frozen=True)
class Row:
    """One line of the dashboard."""

    notebook: str
    done: int
    total: int
    detail: str


def _homework(folder: Path) -> list[Exercise]:
    """Each homework upgrade as an :class:`Exercise` of 10 (its ledger key is its check's)."""
    page = next((p.name for p in sorted(folder.glob("10_*.ipynb"))), "10_homework.ipynb")
    return [Exercise(Path(page).stem, f"nb10_homework.{u.check}", f"作业升级 {u.number}: {u.title}", page)
            for u in UPGRADE_LIST]


def _detail(items: list[Exercise], checks: dict[str, Any]) -> list[str]:
    """The exercises of one notebook that are not simply passed, with their state and attempts."""
    notes = []
    for ex in items:
        entry = checks.get(ex.check)
        if state(entry) in ("in_progress", "regressed"):
            attempts = _attempts(entry)
            notes.append(f"{ex.check.split('.')[1]} {STATES[state(entry)]}" + (f"({attempts})" if attempts else ""))
    return notes


def dashboard(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> list[Row]:
    """Per notebook: exercises passed / total and a detail (exercises in progress or regressed, the
    self-test's score over its scored questions, the homework upgrades)."""
    ledger = load() if ledger is None else ledger
    checks = ledger["checks"]
    by_notebook: dict[str, list[Exercise]] = {}
    for ex in exercises(folder):
        by_notebook.setdefault(ex.notebook, []).append(ex)
    rows = []
    for notebook, items in by_notebook.items():
        detail = _detail(items, checks)
        if notebook.startswith("09"):
            detail += [f"{title}: 答对 {sum(q['answers'].values())}/{q['total']}"
                       for title, q in ledger["quizzes"].items()]
        done = sum(state(checks.get(ex.check)) == "passed" for ex in items)
        rows.append(Row(notebook, done, len(items), ";".join(detail)))
    upgrades = _homework(folder)
    marks = " ".join(f"{n}{'✅' if state(checks.get(u.check)) == 'passed' else '·'}" for n, u in enumerate(upgrades, 1))
    rows.append(Row(upgrades[0].notebook, sum(state(checks.get(u.check)) == "passed" for u in upgrades), len(upgrades),
                    ";".join([f"作业升级 {marks}", *_detail(upgrades, checks)])))
    return sorted(rows, key=lambda r: r.notebook)


def next_exercise(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> Exercise | None:
    """Where to go next: the exercise the learner is stuck on (in progress or regressed; the one touched
    last), else the first one not started (in notebook order, then the homework upgrades); None when
    every one has passed."""
    ledger = load() if ledger is None else ledger
    checks = ledger["checks"]
    every = exercises(folder) + _homework(folder)
    stuck = [ex for ex in every if state(checks.get(ex.check)) in ("in_progress", "regressed")]
    if stuck:
        return max(stuck, key=lambda ex: checks[ex.check].get("time", ""))
    return next((ex for ex in every if state(checks.get(ex.check)) != "passed"), None)


def still_open(notebook: str) -> None:
    """Print the exercises of ``notebook`` (``"07_single_batch_overfit"``) not passed yet, with their state.

    The last cell of every learner copy calls it (``course_tools.release`` adds it), so a Run All ends
    with what is left to do. Never raises: a missing ledger or notebook folder only shortens the list.
    """
    if ledger_path() is None:
        print("进度记录已关闭(COURSE_PROGRESS=off):这里列不出还没通过的练习。")
        return
    try:
        items = [ex for ex in exercises() if ex.notebook == notebook]
    except (OSError, ValueError):
        items = []
    checks = load()["checks"]
    left = [ex for ex in items if state(checks.get(ex.check)) != "passed"]
    if not left:
        print(f"✅ 本笔记本的 {len(items)} 个练习都通过了。" if items else "本笔记本没有带检查的练习。")
        return
    print(f"本笔记本还有 {len(left)}/{len(items)} 个练习没通过:")
    for ex in left:
        entry = checks.get(ex.check)
        attempts = _attempts(entry)
        print(f"  - 「{ex.section}」 {ex.check.split('.')[1]}: {STATES[state(entry)]}"
              + (f"({attempts})" if attempts else ""))


def width(text: str) -> int:
    """Display columns of ``text``: a wide (CJK) character takes two (``width("EMA 衰减率")``: 10)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pad(s: str, columns: int) -> str:
    return s + " " * (columns - width(s))


def _next_line(ex: Exercise | None, ledger: dict[str, Any]) -> str:
    if ex is None:
        return "全部完成:每个练习和作业升级都通过了。"
    entry = ledger["checks"].get(ex.check)
    why = {"in_progress": "卡在这里", "regressed": "通过过,最近一次没通过"}.get(state(entry), "下一个没做的")
    attempts = _attempts(entry)
    return (f"下一步({why}{',' + attempts if attempts else ''}): notebooks/{ex.notebook}.ipynb 的「{ex.section}」"
            f"({ex.check.split('.')[1]})")


SCROLL = "JupyterLab 打开笔记本时停在开头:在左栏的目录(Table of Contents)里点这一节的标题即可跳过去。"


def text(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> str:
    """The dashboard as a plain-text table and the next step."""
    ledger = load() if ledger is None else ledger
    head = ("笔记本", "通过", "说明")
    body = [(r.notebook, f"{r.done}/{r.total}", r.detail) for r in dashboard(ledger, folder)]
    widths = [max(width(row[i]) for row in (head, *body)) for i in range(2)]
    lines = ["  ".join((_pad(row[0], widths[0]), _pad(row[1], widths[1]), row[2])).rstrip() for row in (head, *body)]
    lines.insert(1, "-" * (sum(widths) + 8))
    path = ledger_path()
    ex = next_exercise(ledger, folder)
    lines += ["", _next_line(ex, ledger), *([SCROLL] if ex else []),
              f"(记录在 {path},只在你的电脑上)" if path else "(进度记录已关闭: COURSE_PROGRESS=off)"]
    return "\n".join(lines)


def html_table(ledger: dict[str, Any] | None = None, folder: Path = NOTEBOOKS) -> str:
    """The dashboard as plain HTML: a table and a link to the next unfinished exercise's section."""
    ledger = load() if ledger is None else ledger
    esc = html.escape
    rows = "".join(f"<tr><td><a href=\"{esc(r.notebook)}.ipynb\">{esc(r.notebook)}</a></td>"
                   f"<td>{r.done}/{r.total}</td><td>{esc(r.detail)}</td></tr>" for r in dashboard(ledger, folder))
    ex = next_exercise(ledger, folder)
    line = esc(_next_line(ex, ledger))
    if ex is not None:  # the link opens the notebook; the line names the section to click in its contents
        target = f"notebooks/{ex.notebook}.ipynb"
        line = line.replace(esc(target), f"<a href=\"{esc(ex.link)}\">{esc(target)}</a>", 1) + f"<br>{esc(SCROLL)}"
    after = f"<p class=\"next\">{line}</p>"
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
