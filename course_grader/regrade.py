"""Regrading with a diff: each row is stamped with what produced it; ``--regrade OLD.csv`` reruns what changed.

The stamp: ``version`` per check (a hash of the check cell, the ``check_*`` it calls and its exercise's reference
solution; for an upgrade, its check function and the reference scripts it names), ``python``, ``torch``,
``submission`` (the notebook's hash, or the homework's head and scripts), and ``grader`` (recorded, not compared).
A row whose stamp equals OLD's is copied and nothing runs; ``<stem>.diff.csv`` lists each learner x check whose
verdict changed (:data:`DIFF_COLUMNS`), as does ``grades.html``. Pitfall: a version hashes the check function's
own source, not its helpers: after changing only a helper, grade without ``--regrade``.

Example::

    python -m course_grader submissions/ --report new.csv --regrade grades.csv   # then new.diff.csv
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from course_grader.hand_in import digest
from course_grader.plan import cell_source, check_function, make_plan, read_notebook
from course_grader.report import Grade, load_report, safe_field, write_rows
from course_grader.upgrades import upgrade_label
from course_tools.checks.nb10_homework import UPGRADES

if TYPE_CHECKING:
    from course_grader.steps import Submission

__all__ = ["ROW_COLUMNS", "CHECK_COLUMNS", "DIFF_COLUMNS", "add_arguments", "read_arguments", "step",
           "diff_rows", "finish"]

ROW_COLUMNS = ("python", "torch", "submission", "grader")
CHECK_COLUMNS = ("version",)
DIFF_COLUMNS = ("learner", "notebook", "check", "old", "new", "changed")
_COMPARED = ("python", "torch", "submission")   # the grader's commit is recorded, not compared
_ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regrade", type=Path, default=None, metavar="OLD.csv",
                        help="re-run only the rows whose stamp (check versions, Python, torch, submission) differs "
                             "from OLD.csv's; writes <report>.diff.csv (needs --report)")


def read_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[tuple[str, str], Grade] | None:
    """OLD.csv's rows by key, read before the new report is opened (it may be the same file)."""
    if args.regrade is None:
        return None
    if not args.report:
        parser.error("--regrade 需要 --report")
    if not args.regrade.is_file():
        parser.error(f"--regrade: 找不到 {args.regrade}")
    return {g.key: g for g in load_report(args.regrade)}   # with their check rows and stamps


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return h.hexdigest()[:16]


def _source(module: str, name: str) -> str:
    try:
        return inspect.getsource(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


@functools.lru_cache(maxsize=None)
def _notebook_versions(reference: Path, mtime: float) -> dict[str, str]:
    """Check label -> version for a reference notebook (``mtime``: a changed file is read again)."""
    from course_tools.release import learner_notebook

    solved = read_notebook(reference)
    plan = make_plan(learner_notebook(solved, reference.name), solved)    # exercises: the reference solutions
    versions = {}
    for index in plan.checks:
        source = cell_source(plan.notebook.cells[index])
        if index in plan.outside:
            function = _source(plan.outside[index].module, plan.outside[index].function)
        else:
            module, _, name = check_function(source).partition(".")
            function = _source(f"course_tools.checks.{module}", name) if name else ""
        owner = plan.owner[index]
        solution = cell_source(plan.notebook.cells[owner]) if owner is not None else ""
        versions[plan.label(index)] = _hash(source, function, solution)
    return versions


def _homework_versions(reference: Path) -> dict[str, str]:
    """Upgrade label -> version: its check function and the reference scripts it names."""
    return {upgrade_label(u): _hash(inspect.getsource(u.check), *((reference / name).read_bytes()
                                    if (reference / name).is_file() else b"" for name in u.scripts))
            for u in UPGRADES}


@functools.lru_cache(maxsize=None)
def _environment() -> dict[str, str]:
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = ""
    done = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {"python": platform.python_version(), "torch": torch,
            "grader": done.stdout.strip() if done.returncode == 0 else ""}


def _submission(sub: Submission) -> str:
    if sub.setup is not None:     # the homework: its head commit and the scripts of its working tree
        return _hash(sub.history.head.sha if sub.history else "", digest(sub.head) if sub.head else "")
    path = sub.item.path
    try:   # never through a symlink or from a fifo; streamed, whatever its size
        if path is None or path.is_symlink() or not path.is_file():
            return ""
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()[:16]
    except OSError:
        return ""


def step(sub: Submission) -> None:
    """Stamp the row; with ``--regrade``, keep OLD's row when its stamp is the same (nothing runs)."""
    reference = sub.item.reference
    versions = (_homework_versions(sub.setup.reference) if sub.setup is not None
                else _notebook_versions(reference, reference.stat().st_mtime))
    sub.grade.extra.update(_environment(), submission=_submission(sub))
    sub.check_extra.update({label: {"version": version} for label, version in versions.items()})
    old = (sub.settings.get("regrade") or {}).get(sub.grade.key)
    if (old is None or any(old.extra.get(k, "") != sub.grade.extra[k] for k in _COMPARED)
            or {c.check: c.extra.get("version", "") for c in old.checks} != versions):
        return
    grade = sub.grade
    grade.passed, grade.total, grade.notes, grade.review = old.passed, old.total, old.notes, old.review
    grade.checks, grade.commits, grade.extra = old.checks, old.commits, old.extra
    sub.done = sub.final = True


def _changed(old: Grade | None, new: Grade | None, label: str) -> str:
    """What differs in the two rows' stamps for ``label``, e.g. ``torch 2.4.0 -> 2.5.1; version 1a2b -> 3c4d``."""
    before, after = old.extra if old else {}, new.extra if new else {}
    versions = [{c.check: c.extra.get("version", "") for c in g.checks} if g else {} for g in (old, new)]
    pairs = [(k, before.get(k, ""), after.get(k, "")) for k in _COMPARED]
    pairs.append(("version", versions[0].get(label, ""), versions[1].get(label, "")))
    return "; ".join(f"{k} {a or '-'} -> {b or '-'}" for k, a, b in pairs if a != b) or "印记相同"


def diff_rows(old: dict[tuple[str, str], Grade], grades: list[Grade]) -> list[dict[str, str]]:
    """One row per learner x check whose verdict differs between ``old`` and ``grades`` (:data:`DIFF_COLUMNS`)."""
    new = {g.key: g for g in grades}
    rows = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        checks = [{c.check: c for c in g.checks} if g else {} for g in (before, after)]
        for label in dict.fromkeys([*checks[0], *checks[1]]):
            a, b = ("" if c is None else "1" if c.passed else "0" for c in (checks[0].get(label), checks[1].get(label)))
            if a != b:
                rows.append({"learner": key[0], "notebook": key[1], "check": safe_field(label, 200), "old": a,
                             "new": b, "changed": _changed(before, after, label)})
    return rows


def finish(report: Path, grades: list[Grade], settings: dict) -> str:
    """With ``--regrade``: write ``<report stem>.diff.csv`` and return the class page's section (else "")."""
    old = settings.get("regrade")
    if old is None:
        return ""
    rows = diff_rows(old, grades)
    write_rows(report.with_name(report.stem + ".diff.csv"), DIFF_COLUMNS, rows)
    from course_grader.html_report import html_table

    shown = {"1": "✅", "0": "❌", "": "-"}
    table = html_table(["学员", "notebook", "检查", "原来", "现在", "印记的变化"], [[r["learner"], r["notebook"], r["check"],
                       shown[r["old"]], shown[r["new"]], r["changed"]] for r in rows])
    return f"<h2 id=\"regrade\">重新批改: 结论改变的检查({len(rows)} 行)</h2>\n{table}"
