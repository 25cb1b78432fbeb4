"""The grader's CSV reports: rows appended as each notebook finishes, shard merging, pass rates, feedback.

The files are those the package's ``--help`` lists; each row is flushed, so ``--resume`` goes on after an interruption.
Pitfall: every field is untrusted: :func:`safe_field` makes it one line and puts ``'`` before a leading
``= + - @`` (or tab, CR), so a spreadsheet shows text instead of running a formula.

Example::

    report = Report(Path("grades.csv"))
    report.add(grade)                     # after each notebook
    report.finish(report.grades)          # pass rates and feedback
"""
from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course_grader.collect import Finding, Item
from course_grader.kernel import clean_text

__all__ = ["COLUMNS", "CHECK_COLUMNS", "FILE_COLUMNS", "CheckOutcome", "Grade", "safe_field", "row_columns",
           "write_rows", "read_rows", "Report", "load_report", "merge_reports", "by_learner", "learner_scores",
           "percent", "counted", "pass_rates", "pass_rate_table", "feedback_names", "table"]

COLUMNS = ("learner", "notebook", "passed", "total", "score", "commits", "review", "notes")
CHECK_COLUMNS = ("learner", "notebook", "check", "passed", "message")
FILE_COLUMNS = ("path", "learner", "status", "reason")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def safe_field(value: object, limit: int = 4000) -> str:
    """One clean CSV/terminal field: control characters stripped, formula prefixes neutralised."""
    text = clean_text(value, limit)
    return "'" + text if text.startswith(_FORMULA) else text


@dataclass
class CheckOutcome:
    """One check cell of one graded notebook: its id, whether it passed, and the message shown to the learner."""

    check: str
    passed: bool
    message: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Grade:
    """One learner x notebook row. ``commits``: the homework's commit-discipline verdict (empty for notebooks);
    ``extra``: the step modules' own columns (:func:`row_columns`)."""

    learner: str
    notebook: str
    passed: int = 0
    total: int = 0
    notes: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)
    checks: list[CheckOutcome] = field(default_factory=list)
    commits: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def fresh(cls, item: Item, total: int, sandbox: bool) -> Grade:
        """The row ``item`` starts with: whether the sandbox was off, then the collector's notes and review."""
        return cls(item.learner, item.reference.name, total=total, review=list(item.review),
                   notes=([] if sandbox else ["未沙箱运行(--no-sandbox)"]) + list(item.notes))

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def key(self) -> tuple[str, str]:
        return safe_field(self.learner, 400), safe_field(self.notebook, 400)

    def row(self) -> dict[str, str]:
        return {"learner": self.key[0], "notebook": self.key[1], "passed": str(self.passed), "total": str(self.total),
                "score": f"{self.score:.3f}", "commits": safe_field(self.commits, 400),
                "review": safe_field(" | ".join(self.review)),
                "notes": safe_field(" | ".join(self.notes))} | _extra(self.extra, "ROW_COLUMNS")

    def check_rows(self) -> list[dict[str, str]]:
        return [{"learner": self.key[0], "notebook": self.key[1], "check": safe_field(c.check, 200),
                 "passed": "1" if c.passed else "0", "message": safe_field(c.message, 1000)}
                | _extra(c.extra, "CHECK_COLUMNS") for c in self.checks]


def step_columns(kind: str) -> tuple[str, ...]:
    """The extra columns the step modules add (``kind``: ``ROW_COLUMNS`` or ``CHECK_COLUMNS``), in step order."""
    from course_grader.steps import hooks

    return tuple(c for columns in hooks(kind).values() for c in columns)


def row_columns() -> tuple[str, ...]:
    return COLUMNS + step_columns("ROW_COLUMNS")


def _extra(values: dict[str, str], kind: str) -> dict[str, str]:
    return {c: safe_field(values.get(c, ""), 400) for c in step_columns(kind)}


def _sibling(report: Path, suffix: str) -> Path:
    return report.with_name(report.stem + suffix)


def _start(path: Path, columns: tuple[str, ...], rows):
    """A CSV file with the header ``columns``, then ``rows`` (dicts), flushed and left open: (file, writer)."""
    f = open(path, "w", newline="", encoding="utf-8")
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    f.flush()
    return f, writer


def write_rows(path: Path, columns: tuple[str, ...], rows) -> None:
    """A CSV file: the header ``columns``, then ``rows`` (dicts)."""
    _start(path, columns, rows)[0].close()


def read_rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows (dicts) of the CSV ``path`` that have every one of ``columns`` ([] when there is no file)."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if all(r.get(c) is not None for c in columns)]  # a torn last line is dropped


def load_report(path: Path) -> list[Grade]:
    """The grades of a report written by :class:`Report` (its check rows attached)."""
    grades = {}
    for r in read_rows(path, COLUMNS):
        grades[r["learner"], r["notebook"]] = Grade(
            r["learner"], r["notebook"], int(r["passed"]), int(r["total"]),
            [n for n in r["notes"].split(" | ") if n], [n for n in r["review"].split(" | ") if n],
            commits=r["commits"], extra={c: r[c] for c in step_columns("ROW_COLUMNS") if r.get(c)})
    for r in read_rows(_sibling(path, ".checks.csv"), CHECK_COLUMNS):
        grade = grades.get((r["learner"], r["notebook"]))
        if grade is not None:
            grade.checks.append(CheckOutcome(r["check"], r["passed"] == "1", r["message"],
                                             {c: r[c] for c in step_columns("CHECK_COLUMNS") if r.get(c)}))
    return list(grades.values())


class Report:
    """The files of one ``--report`` path, appended to as notebooks finish. ``resume``: keep the rows already
    there (``done``: their keys), minus a torn last line and the learners in ``drop`` (``--only``)."""

    def __init__(self, path: Path, resume: bool = False, drop: frozenset[str] = frozenset()) -> None:
        self.path = Path(path)
        self.grades: list[Grade] = [g for g in load_report(self.path) if g.key[0] not in drop] if resume else []
        self.done = {g.key for g in self.grades}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._grades_file = _start(self.path, row_columns(), [g.row() for g in self.grades])
        self._checks_file = _start(_sibling(self.path, ".checks.csv"), CHECK_COLUMNS + step_columns("CHECK_COLUMNS"),
                                   [r for g in self.grades for r in g.check_rows()])

    def add(self, grade: Grade) -> None:
        """Append one finished notebook (check rows first, so a row in grades.csv is always complete)."""
        for f, writer, rows in ((*self._checks_file, grade.check_rows()), (*self._grades_file, [grade.row()])):
            writer.writerows(rows)
            f.flush()
        self.grades.append(grade)
        self.done.add(grade.key)

    def write_files(self, findings: list[Finding]) -> None:
        write_rows(_sibling(self.path, ".files.csv"), FILE_COLUMNS,
                   ({"path": safe_field(x.path), "learner": safe_field(x.learner), "status": x.status,
                     "reason": safe_field(x.reason)} for x in findings))

    def finish(self, grades: list[Grade]) -> None:
        """Close the row files; write the pass rates and one feedback file per learner."""
        for f, _ in (self._grades_file, self._checks_file):
            f.close()
        write_rows(_sibling(self.path, ".pass_rate.csv"), ("notebook", "check", "passed", "graded", "rate"),
                   ({"notebook": nb, "check": check, "passed": p, "graded": n, "rate": f"{p / n:.3f}" if n else ""}
                    for nb, check, p, n in pass_rates(grades)))
        folder = _sibling(self.path, "_feedback")
        folder.mkdir(parents=True, exist_ok=True)
        rows = by_learner(grades)
        for learner, base in feedback_names(list(rows)).items():
            (folder / f"{base}.md").write_text(feedback_markdown(learner, rows[learner]), encoding="utf-8")


def by_learner(grades: list[Grade]) -> dict[str, list[Grade]]:
    """learner (as in the report's column) -> their rows, in the order of ``grades``."""
    rows: dict[str, list[Grade]] = {}
    for g in grades:
        rows.setdefault(g.key[0], []).append(g)
    return rows


def learner_scores(grades: list[Grade], only: Callable[[Grade], bool] | None = None) -> dict[str, tuple[int, int]]:
    """learner -> (checks passed, checks in total) over their rows that ``only`` keeps (default: all), as 总分 counts."""
    return {name: (sum(g.passed for g in rows), sum(g.total for g in rows))
            for name, rows in by_learner([g for g in grades if only is None or only(g)]).items()}


def percent(passed: int, total: int) -> str:
    """``passed / total`` as a whole percentage, ``-`` when there is nothing to count."""
    return f"{passed / total:.0%}" if total else "-"


def feedback_names(learners: list[str]) -> dict[str, str]:
    """learner -> base name of their .md and .html feedback (``sec2__bob``): no ``/`` or ``..``, unique, in order."""
    used: set[str] = set()
    names = {}
    for learner in learners:
        base = re.sub(r"[^\w.-]+", "_", learner.replace("/", "__")).strip("._") or "learner"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        names[learner] = name
    return names


def counted(check: CheckOutcome) -> bool:
    """Whether ``check`` counts in the class statistics: its notebook was submitted and could be read."""
    return not check.message.startswith(("未提交", "无法读取"))


def pass_rates(grades: list[Grade]) -> list[tuple[str, str, int, int]]:
    """(notebook, check, passed, graded) per check, over the notebooks that were submitted and run."""
    counts: dict[tuple[str, str], list[int]] = {}
    for g in grades:
        for c in filter(counted, g.checks):
            acc = counts.setdefault((g.key[1], c.check), [0, 0])
            acc[0] += c.passed
            acc[1] += 1
    return [(nb, check, p, n) for (nb, check), (p, n) in sorted(counts.items())]


def pass_rate_table(grades: list[Grade]) -> str:
    rows = [("notebook", "check", "passed", "rate")]
    rows += [(nb, check, f"{p}/{n}", percent(p, n)) for nb, check, p, n in pass_rates(grades) if n]
    return _align(rows)


def _md(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def feedback_markdown(learner: str, grades: list[Grade]) -> str:
    """One learner's feedback: the score per notebook and each failed check's message, in Chinese."""
    passed, total = sum(g.passed for g in grades), sum(g.total for g in grades)
    lines = [f"# 批改反馈: {_md(learner)}", "", f"总分: {passed}/{total}" + (f"({passed / total:.0%})" if total else ""), ""]
    for g in sorted(grades, key=lambda g: g.notebook):
        lines += [f"## {_md(g.notebook)}: {g.passed}/{g.total}", ""]
        if g.commits:
            lines += [f"提交纪律: {_md(g.commits)}", ""]
        for c in g.checks:
            lines.append(f"- ✅ {_md(c.check)}" if c.passed else f"- ❌ {_md(c.check)}: {_md(c.message or '未通过')}")
        if g.notes:
            lines += ["", "说明:"] + [f"- {_md(n)}" for n in g.notes]
        lines.append("")
    return "\n".join(lines)


def _align(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def table(grades: list[Grade]) -> str:
    """Rows, one total line per learner, the notes and the rows flagged for review, for the terminal."""
    rows = [("learner", "notebook", "passed", "total", "score")]
    rows += [(g.key[0], g.key[1], str(g.passed), str(g.total), percent(g.passed, g.total)) for g in grades]
    rows += [(name, "(all)", str(p), str(t), percent(p, t)) for name, (p, t) in learner_scores(grades).items()]
    out = [_align(rows)]
    for title, lines in (("notes:", lambda g: g.notes), ("需人工检查 (needs manual review):", lambda g: g.review)):
        listed = [f"- {g.key[0]} / {g.key[1]}: {safe_field('; '.join(lines(g)), 600)}" for g in grades if lines(g)]
        out += ["", title, *listed] if listed else []
    return "\n".join(out)


def merge_reports(inputs: list[Path], output: Path) -> list[Grade]:
    """Combine shard reports into ``output``; a learner x notebook in two inputs (overlapping shards) is an error."""
    grades: dict[tuple[str, str], Grade] = {}
    for path in inputs:
        for g in load_report(path):
            if g.key in grades:
                raise ValueError(f"{g.key[0]} / {g.key[1]} 同时出现在多个分片里({path}),分片不应重叠")
            grades[g.key] = g
    merged = sorted(grades.values(), key=lambda g: g.key)
    report = Report(output)
    for g in merged:
        report.add(g)
    report.write_files([Finding(r["path"], r["learner"], r["status"], r["reason"]) for path in inputs
                        for r in read_rows(_sibling(path, ".files.csv"), FILE_COLUMNS)])
    report.finish(merged)
    return merged
