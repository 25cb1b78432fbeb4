"""The instructor's grader: each learner's notebooks and homework, graded against the reference in ``solutions/``.

Each graded notebook is rebuilt from the released reference with only the learner's ``exercise`` cells put in
(editing a check cell changes nothing), run in a fresh kernel inside a bubblewrap sandbox and scored by the
grader itself: score = check cells passed / check cells in the reference. A cell past its time limit is
interrupted and the notebook run again with that exercise stubbed, so the others still earn their marks.
Exercises that reach the check machinery are flagged for review and run as stubs. The homework
(``10_homework``) is one more row per learner: each upgrade's check on the learner's scripts, and the commit
history's discipline when one is handed in. Without bubblewrap the grader stops; ``--no-sandbox`` is for
trusted code only (the learner's code then runs as you) and says so in every row.

    python -m course_grader submissions/ --report grades.csv --jobs 2
    python -m course_grader submissions/ --report grades.csv --resume             # after an interruption
    python -m course_grader submissions/ --report grades.csv --only alice,sec2/bob  # grade again, merge in
    python -m course_grader submissions/ --report new.csv --regrade grades.csv   # re-run what changed
    python -m course_grader submissions/ --report part1.csv --shard 1/2          # on machine 1 of 2
    python -m course_grader merge part1.csv part2.csv --report grades.csv
    python -m course_grader export grades.csv --format canvas --roster roster.csv  # or moodle, xlsx

Written next to --report grades.csv: grades.csv (a row per learner x notebook), grades.checks.csv (a row
per check), grades.files.csv (every file met, and why), grades.pass_rate.csv, grades.similarity.csv (pairs
of learners whose scripts are alike, for a person to look at), grades.diff.csv (--regrade: the verdicts
that changed), grades.html and grades_feedback/ (a page per learner).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from course_tools.cputime import WALL_FACTOR
from course_grader.pipeline import ROOT, Options, UnknownLearner, grade_all, grade_item
from course_grader.report import load_report, merge_reports, pass_rate_table, table
from course_grader.steps import hooks
from course_tools.release import AuthoringError
from course_grader.sandbox import GiB, Limits, SandboxUnavailable

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]


def _shard_arg(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise argparse.ArgumentTypeError("格式为 K/N,1 ≤ K ≤ N,例如 2/4")
    return int(match.group(1)), int(match.group(2))


def _size_arg(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([GgMm])?i?[Bb]?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError("例如 6G 或 4096M")
    return int(float(match.group(1)) * (2 ** 20 if (match.group(2) or "G").upper() == "M" else GiB))


def _merge(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m course_grader merge",
                                description="Combine the reports of --shard runs into one.")
    p.add_argument("inputs", nargs="+", type=Path, help="the shards' grades CSV files")
    p.add_argument("--report", type=Path, required=True, help="the combined CSV to write")
    p.add_argument("--solutions", type=Path, default=ROOT / "solutions",
                   help="reference notebooks, for the hints of the feedback pages (default: solutions/)")
    args = p.parse_args(argv)
    from course_grader.html_report import check_guide, write_pages
    from course_grader.plan import references

    try:
        guide = check_guide(references(args.solutions)[1])
        grades = merge_reports(args.inputs, args.report)
    except (ValueError, OSError) as exc:   # AuthoringError is a ValueError
        print(f"无法合并: {exc}", file=sys.stderr)
        return 2
    write_pages(args.report, grades, guide)
    print(table(grades))
    print(f"\n{pass_rate_table(grades)}\n\nwrote {args.report} (+ {args.report.with_suffix('.html').name})")
    return 0


def _export(argv: list[str]) -> int:
    from course_grader.export import FORMATS, RosterError, gradebook, read_roster, write_export

    p = argparse.ArgumentParser(prog="python -m course_grader export",
                                description="Write the gradebook an LMS imports (see the README).")
    p.add_argument("report", type=Path, help="the grades CSV a grading run wrote")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--roster", type=Path, default=None, help="CSV: learner,name,id,login,email,section")
    p.add_argument("--out", type=Path, default=None, help="default: <report>.<format>.csv or .xlsx")
    args = p.parse_args(argv)
    if not args.report.is_file():
        print(f"无法导出: 找不到报告 {args.report}", file=sys.stderr)
        return 2
    try:
        roster = read_roster(args.roster) if args.roster else None
    except RosterError as exc:
        print(f"无法导出: {exc}", file=sys.stderr)
        return 2
    book = gradebook(load_report(args.report), roster)
    suffix = ".xlsx" if args.format == "xlsx" else f".{args.format}.csv"
    out = write_export(book, args.format, args.out or args.report.with_name(args.report.stem + suffix))
    for line in book.unmatched:
        print(line)
    print(f"wrote {out}: {len(book.rows)} 位学员, {len(book.assignments)} 项作业 + 总分")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_grader", description=__doc__,   # the help text: above
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("submissions", nargs="+", type=Path, help="notebooks, learner folders, or class folders")
    p.add_argument("--report", type=Path, default=None, help="CSV to write; the other files go next to it (above)")
    p.add_argument("--solutions", type=Path, default=ROOT / "solutions", help="reference notebooks (default: solutions/)")
    d = Options()
    p.add_argument("--cell-timeout", type=float, default=d.cell_timeout, help=f"CPU seconds per cell; a cell that "
                   f"sleeps is stopped after {WALL_FACTOR}x this in wall time (default {d.cell_timeout:g})")
    p.add_argument("--timeout", type=float, default=d.timeout, help=f"hard limit per notebook in CPU seconds, all "
                   f"reruns included; {WALL_FACTOR}x this in wall time at most (default {d.timeout:g})")
    p.add_argument("--jobs", type=int, default=d.jobs, help=f"notebooks graded at the same time (default {d.jobs})")
    p.add_argument("--shard", type=_shard_arg, default=None, help="K/N: grade only the K-th of N parts of the learners")
    p.add_argument("--resume", action="store_true", help="keep the rows already in --report, grade the rest")
    p.add_argument("--only", default=None, help="alice,sec2/bob: grade these learners again and merge them into "
                   "--report (the other rows stay as they are)")
    p.add_argument("--memory", type=_size_arg, default=d.limits.memory,
                   help=f"address-space limit per process (default {d.limits.memory / GiB:g}G)")
    p.add_argument("--no-sandbox", action="store_true", help="run learner code WITHOUT the bubblewrap sandbox")
    p.add_argument("--run-flagged", action="store_true", help="run exercises flagged for review (once reviewed) instead of stubbing them")
    p.add_argument("--require-commits", action="store_true",
                   help="homework: a history that fails the commit-discipline verdict scores 0 (default: reported only)")
    p.add_argument("--no-homework", action="store_true", help="grade the notebooks only, not the homework scripts")
    for add_arguments in hooks("add_arguments").values():   # the step modules' own flags
        add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); exit status 2 when the sandbox cannot start or
    an input cannot be used (a malformed reference, overlapping shards, an unknown ``--only`` learner, ...)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return _merge(argv[1:])
    if argv[:1] == ["export"]:
        return _export(argv[1:])
    p = _parser()
    args = p.parse_args(argv)
    if (args.resume or args.only is not None) and not args.report:
        p.error("--resume 和 --only 需要 --report")
    only = frozenset(n.strip().strip("/") for n in args.only.split(",") if n.strip()) if args.only is not None else None
    if only is not None and not only:
        p.error("--only 需要至少一个学员名,例如 --only alice,sec2/bob")
    options = Options(cell_timeout=args.cell_timeout, timeout=args.timeout, jobs=max(1, args.jobs),
                      sandbox=not args.no_sandbox, limits=Limits(memory=args.memory), run_flagged=args.run_flagged,
                      homework=not args.no_homework, require_commits=args.require_commits,
                      steps={name: read(args, p) for name, read in hooks("read_arguments").items()})
    try:
        grades = grade_all(args.submissions, args.solutions, options, args.report, args.shard, args.resume, only=only)
    except (UnknownLearner, SandboxUnavailable, AuthoringError) as exc:
        why = {SandboxUnavailable: "无法启动沙箱: ", AuthoringError: "参考 notebook 有编写错误: "}.get(type(exc), "")
        print(f"{why}{exc}", file=sys.stderr)
        return 2
    print(table(grades))
    print(f"\n{pass_rate_table(grades)}")
    if args.report:
        print(f"\nwrote {args.report} (+ .checks.csv, .files.csv, .pass_rate.csv, .similarity.csv, "
              f"{args.report.with_suffix('.html').name}, {args.report.stem}_feedback/)")
    return 0
