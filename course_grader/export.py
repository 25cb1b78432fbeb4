"""The gradebook an LMS imports: ``python -m course_grader export grades.csv --format canvas|moodle|xlsx``.

A row per learner, a column per graded notebook (percent, one decimal), then the total over all checks.
``canvas``: Canvas's own export columns, the total in the read-only ``Final Score`` (its import ignores it);
``moodle``: one identity column to map, ``Total`` mapped to nothing; ``xlsx``: one sheet, Chinese headers.
The roster (``--roster``: ``learner`` and any of :data:`ROSTER_COLUMNS`) maps folders to LMS identities;
unmatched learners on either side are kept (roster-only ones scored 0) and listed in ``Gradebook.unmatched``.
Pitfall: folder names and roster fields are untrusted: every text cell goes through ``safe_field``, xlsx too.

Example::

    write_export(gradebook(load_report(Path("grades.csv")), read_roster(Path("roster.csv"))), "canvas", out)
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from course_grader.report import Grade, by_learner, learner_scores, safe_field

__all__ = ["FORMATS", "ROSTER_COLUMNS", "RosterError", "Entry", "Gradebook", "read_roster", "gradebook",
           "layout", "write_export"]

FORMATS = ("canvas", "moodle", "xlsx")
ROSTER_COLUMNS = ("learner", "name", "id", "login", "email", "section")
_IDENTITY = {"canvas": ("Student", "ID", "SIS User ID", "SIS Login ID", "Section"),
             "moodle": ("Full name", "ID number", "Email address"),
             "xlsx": ("学员文件夹", "姓名", "学号", "邮箱", "班级")}
_TOTAL = {"canvas": "Final Score", "moodle": "Total", "xlsx": "总分 (%)"}


class RosterError(ValueError):
    """A roster that cannot be used; ``str()`` says why, in Chinese, on one line."""


@dataclass(frozen=True)
class Entry:
    """One roster line: the learner folder and the LMS identity (every field already spreadsheet-safe)."""

    learner: str
    name: str = ""
    id: str = ""
    login: str = ""
    email: str = ""
    section: str = ""


@dataclass
class Gradebook:
    """Learner rows (roster identity, percentage per assignment, total) and the lines naming the unmatched."""

    assignments: list[str]
    rows: list[tuple[Entry, dict[str, float], float]] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)


def read_roster(path: Path) -> dict[str, Entry]:
    """learner folder -> :class:`Entry`; a missing ``learner`` column or a folder listed twice is a RosterError."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip().lower() for h in reader.fieldnames or []]
            if "learner" not in header:
                raise RosterError(f"花名册 {path.name} 缺少 learner 列(可用的列: {', '.join(ROSTER_COLUMNS)})")
            lines = [{h: (v or "").strip() for h, v in zip(header, row.values()) if isinstance(v, str)}
                     for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RosterError(f"无法读取花名册 {path.name}: {type(exc).__name__}") from None
    roster: dict[str, Entry] = {}
    for line in lines:
        entry = Entry(*(safe_field(line.get(c, ""), 400) for c in ROSTER_COLUMNS))
        if not entry.learner:
            continue
        if entry.learner in roster:
            raise RosterError(f"花名册里学员文件夹 {entry.learner} 出现了两次")
        roster[entry.learner] = entry
    return roster


def gradebook(grades: list[Grade], roster: dict[str, Entry] | None = None) -> Gradebook:
    """One row per learner graded or on the roster; ``unmatched`` names both kinds of mismatch."""
    roster = roster if roster is not None else {}
    assignments = sorted({g.key[1].removesuffix(".ipynb") for g in grades})
    totals = learner_scores(grades)
    scores = {name: {g.key[1].removesuffix(".ipynb"): round(g.score * 100, 1) for g in rows}
              for name, rows in by_learner(grades).items()}
    book = Gradebook(assignments)
    for learner in sorted(scores):
        p, t = totals[learner]
        book.rows.append((roster.get(learner, Entry(learner, name=learner)), scores[learner],
                          round(100 * p / t, 1) if t else 0.0))
        if roster and learner not in roster:
            book.unmatched.append(f"不在花名册里(LMS 标识留空): {learner}")
    for learner in sorted(set(roster) - set(scores)):
        book.rows.append((roster[learner], {a: 0.0 for a in assignments}, 0.0))
        book.unmatched.append(f"花名册里有、但没有任何提交(记 0 分): {learner}")
    return book


def _identity(entry: Entry, fmt: str) -> list[str]:
    if fmt == "canvas":
        return [entry.name, entry.id, "", entry.login or entry.email, entry.section]
    if fmt == "moodle":
        return [entry.name, entry.id, entry.email]
    return [entry.learner, entry.name, entry.id, entry.email, entry.section]


def layout(book: Gradebook, fmt: str) -> list[list[str | float]]:
    """The header and the rows of ``fmt`` (see the module docstring); text cells spreadsheet-safe."""
    if fmt not in FORMATS:
        raise ValueError(f"未知的格式 {fmt}(可选: {', '.join(FORMATS)})")
    suffix = " (%)" if fmt == "xlsx" else ""
    header: list[str | float] = [*_IDENTITY[fmt], *(safe_field(a + suffix, 200) for a in book.assignments), _TOTAL[fmt]]
    return [header, *([*_identity(entry, fmt), *(scores.get(a, "") for a in book.assignments), total]
                      for entry, scores, total in book.rows)]


def write_export(book: Gradebook, fmt: str, out: Path) -> Path:
    """Write ``fmt`` to ``out`` (CSV for canvas/moodle, an .xlsx workbook for xlsx); ``out``."""
    table = layout(book, fmt)
    if fmt != "xlsx":
        with open(out, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(table)
        return out
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "成绩"
    for row in table:
        sheet.append(row)
    for cells in sheet.iter_rows():
        for cell in cells:
            if isinstance(cell.value, str):
                cell.data_type = "s"     # text, never a formula, whatever openpyxl guessed
    workbook.save(out)
    return out
