"""Grade learners' notebooks against the reference in ``solutions/`` (instructor tool).

For each learner and each reference notebook that has ``check`` cells, the grader builds the
notebook to run from the reference, as released (solutions stripped, ``solution-only`` cells
dropped): every cell comes from the reference except the source of the ``exercise`` cells, which
comes from the learner. Editing or deleting a check cell therefore changes nothing. The notebook
runs in a fresh kernel inside a bubblewrap sandbox (:mod:`course_tools.sandbox`) and the grader
decides each check's outcome itself, from the kernel's execute replies
(:mod:`course_tools.grade.kernel`); the self-test answers are scored outside the kernel
(:mod:`course_tools.grade.answers`).

    score = check cells passed / check cells in the reference

Partial credit survives loops and crashes: a cell past ``--cell-timeout`` CPU seconds (or five times
that in wall time: code that sleeps) is interrupted (and the kernel killed if the cell ignores the
interrupt for 10 s); a dead kernel is noticed at once. The notebook is then run again with the
offending exercise (the one running, or the last one run before the cell that failed) replaced by
its stub, at most once per exercise, so the other exercises still earn their marks. ``--timeout`` is
a hard limit per notebook, in CPU seconds of all its runs (five times that in wall time). Limits in
CPU time give the same grades on a busy machine. A notebook that cannot be graded
keeps its total (score 0 with the reason). Exercise sources that reach the check machinery or
the runtime are flagged for manual review (:mod:`course_tools.grade.scan`) and run as stubs
(``--run-flagged`` runs them anyway, after review).

    python -m course_tools.grade submissions/ --report grades.csv --jobs 2
    python -m course_tools.grade submissions/ --report part1.csv --shard 1/2     # on machine 1
    python -m course_tools.grade merge part1.csv part2.csv --report grades.csv
    python -m course_tools.grade submissions/ --report grades.csv --resume      # after an interruption
    python -m course_tools.grade submissions/ --report grades.csv --require-commits  # discipline counts

The homework (``10_homework``: the learner's training scripts, when ``solutions/homework/`` holds the
reference scripts) is one more row per learner, graded by :mod:`course_tools.grade.homework`: each
upgrade's check runs here, every run of the learner's scripts in its own sandbox; the commit
history, when handed in, is judged too (``--require-commits`` lets it change the score), and
``grades.similarity.csv`` lists the pairs of learners (and learner x reference) whose scripts
are alike, for a person to look at (:mod:`course_tools.grade.similarity`).

The notebook to run: :mod:`course_tools.grade.plan`. Submissions, collection and reports:
:mod:`course_tools.grade.collect`, :mod:`course_tools.grade.report`.
Without bubblewrap the grader stops with an explanation; ``--no-sandbox`` grades anyway (trusted
code only: the learner's code then runs as you) and says so in every row.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools.grade.answers import outside_check, score_outside
from course_tools.grade.collect import Finding, Item, UnreadableNotebook, collect, read_notebook
from course_tools.grade.homework import HOMEWORK_LIMITS, NOTEBOOK as HOMEWORK, HomeworkSetup, failed_grade, grade_homework, read_scripts
from course_tools.cputime import WALL_FACTOR
from course_tools.grade.kernel import DEADLINES, Budget, CellResult, clean_text, run_cells
from course_tools.grade.report import CheckOutcome, Grade, Report, merge_reports, pass_rate_table, safe_field, table
from course_tools.cells import CHECK, tagged
from course_tools.grade.plan import Plan, cell_source, make_plan, references
from course_tools.release import AuthoringError
from course_tools.sandbox import GiB, KernelBox, Limits, SandboxUnavailable, check_available, private_dir, readonly_paths

__all__ = ["ROOT", "Options", "grade_item", "grade_all", "main"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Options:
    """How notebooks are run. ``cell_timeout``, ``timeout``: CPU seconds per cell and per notebook (all its
    runs), each with a wall-clock backstop of ``WALL_FACTOR`` times that; ``grace``: seconds (wall) a cell
    gets to stop after its interrupt."""

    cell_timeout: float = 120.0
    timeout: float = 900.0
    grace: float = 10.0
    jobs: int = 1
    sandbox: bool = True
    limits: Limits = field(default_factory=Limits)
    run_flagged: bool = False
    homework: bool = True
    require_commits: bool = False
    homework_limits: Limits = HOMEWORK_LIMITS

    @property
    def threads(self) -> int:
        """Torch/OpenMP threads per kernel: the cores shared between the parallel kernels."""
        return max(1, (os.cpu_count() or 1) // self.jobs) if self.jobs > 1 else 0


# ---------------------------------------------------------------- running one submission

def _event(plan: Plan, stop: CellResult, options: Options) -> str:
    where = plan.label(stop.index)
    memory = f"{options.limits.memory / GiB:g} GiB"
    cell, total = options.cell_timeout, options.timeout
    return {
        "timeout": f"{where} 超过单格时限 {cell:g} s(CPU 时间),已中断",
        "wall": f"{where} 墙钟时间超过 {WALL_FACTOR * cell:g} s(单格 CPU 时限 {cell:g} s 的 {WALL_FACTOR} 倍,"
                f"在 sleep 或等待?),已中断",
        "unresponsive": f"{where} 超时后 {options.grace:g} s 仍不响应中断(吞掉了 KeyboardInterrupt?),已终止内核,按崩溃处理",
        "dead": f"内核在运行 {where} 时退出(进程结束、崩溃或超出内存上限 {memory})",
        "deadline": f"超过整本 notebook 的总时限 {total:g} s(CPU 时间),已终止(在 {where})",
        "deadline_wall": f"整本 notebook 墙钟时间超过 {WALL_FACTOR * total:g} s(总 CPU 时限的 {WALL_FACTOR} 倍),"
                         f"已终止(在 {where})",
        "abuse": f"{where} 向内核的连接目录写入大量数据,已终止内核",
    }.get(stop.status, f"{where}: {stop.status}")


async def _run(plan: Plan, stubbed: dict[int, str], options: Options, private: Path, budget: Budget):
    cells = [(i, plan.stubs[i] if i in stubbed else cell_source(c)) for i, c in enumerate(plan.notebook.cells)
             if c.get("cell_type") == "code" and cell_source(c).strip()]
    box = KernelBox(private, options.limits, options.threads, options.sandbox)
    try:
        return await run_cells(cells, box, cell_timeout=options.cell_timeout, budget=budget, grace=options.grace)
    finally:
        box.close()


async def grade_item(item: Item, released: nbformat.NotebookNode, options: Options, private: Path) -> Grade:
    """Grade one learner x notebook; never raises for a bad submission."""
    ref_checks = [c for c in released.cells if tagged(c, CHECK)]
    grade = Grade(item.learner, item.reference.name, total=len(ref_checks), notes=list(item.notes),
                  review=list(item.review))
    if not options.sandbox:
        grade.notes.insert(0, "未沙箱运行(--no-sandbox)")

    def unrun(reason: str) -> None:
        grade.checks = [CheckOutcome(str(c.get("id") or f"check {k + 1}"), False, reason)
                        for k, c in enumerate(ref_checks)]

    if item.path is None:
        unrun("未提交")
        return grade
    try:
        submission = read_notebook(item.path)
    except (UnreadableNotebook, OSError) as exc:
        grade.notes.append(f"无法读取: {exc}")
        unrun(f"无法读取: {exc}")
        return grade
    plan = make_plan(released, submission)
    grade.notes += plan.notes
    stubbed: dict[int, str] = {}
    for index, flags in plan.flags.items():
        text = "; ".join(str(f) for f in flags)
        grade.review.append(f"{plan.label(index)}: {text}")
        if options.run_flagged:
            grade.notes.append(f"需人工检查: {plan.label(index)}: {text}(--run-flagged: 照常运行)")
        else:
            stubbed[index] = f"需人工检查,{plan.label(index)} 未运行,暂按 0 分: {text}"
            grade.notes.append(stubbed[index])
    outcomes: dict[int, CellResult] = {}
    budget = Budget(options.timeout)
    ended = ""
    while True:
        result = await _run(plan, stubbed, options, private, budget)
        if result.startup_error:
            ended = f"内核无法启动: {result.startup_error}"
            grade.notes.append(ended)
            break
        outcomes.update({i: r for i, r in result.cells.items() if i in plan.checks})
        stop = result.stop
        if stop is None:
            break
        event = _event(plan, stop, options)
        offender = stop.index if stop.index in plan.exercises else max(
            (e for e in plan.exercises if e < stop.index), default=None)
        if stop.status in DEADLINES or offender is None or offender in stubbed:
            ended = event + ("" if stop.status in DEADLINES else
                             ";问题不在某个练习里,无法重新运行" if offender is None else ";该练习已按未完成运行过,不再重试")
            grade.notes.append(ended)
            break
        stubbed[offender] = event
        grade.notes.append(f"{event};重新运行,{plan.label(offender)} 按未完成处理")
    for k, index in enumerate(plan.checks):
        label = plan.label(index)
        owner = plan.owner[index]
        if index in plan.outside and not (owner in stubbed and owner in plan.flags and not options.run_flagged):
            exercises = [cell_source(plan.notebook.cells[e]) for e in plan.exercises]
            passed, message = await asyncio.to_thread(score_outside, plan.outside[index], exercises)
        elif index in outcomes:
            cell = outcomes[index]
            passed = cell.status == "ok"
            message = "" if passed else (stubbed[owner] if owner in stubbed else cell.message or cell.status)
        else:
            passed, message = False, "未运行: " + (ended or "内核已退出")
        grade.checks.append(CheckOutcome(label, passed, message))
        if not passed and not any(message in note for note in grade.notes):
            grade.notes.append(f"{label}: {message}")
    grade.passed = sum(c.passed for c in grade.checks)
    return grade


# ---------------------------------------------------------------- a class

def _shard(items: list[Item], findings: list[Finding], shard: tuple[int, int] | None):
    if shard is None:
        return items, findings
    k, n = shard
    learners = sorted({i.learner for i in items})
    mine = {name for index, name in enumerate(learners) if index % n == k - 1}
    return ([i for i in items if i.learner in mine],
            [f for f in findings if f.learner in mine or (not f.learner and k == 1)])


def _check_hidden(paths: list[Path]) -> None:
    visible = readonly_paths()
    for path in paths:
        resolved = Path(path).resolve()
        for bound in visible:
            if resolved == bound or bound in resolved.parents:
                raise SandboxUnavailable(f"{path} 位于沙箱可见的目录 {bound} 里,学员代码能读到它;请把它移到别处")


def grade_all(submissions: list[Path], solutions: Path = ROOT / "solutions", options: Options | None = None,
              report: Path | None = None, shard: tuple[int, int] | None = None, resume: bool = False,
              verbose: bool = True) -> list[Grade]:
    """Grade every learner x graded notebook under ``submissions``; ``jobs`` notebooks at a time.

    With ``report``, rows are written as each notebook finishes (see :class:`Report`). Raises
    :class:`SandboxUnavailable` when the sandbox cannot run (unless ``options.sandbox`` is False).
    """
    options = options or Options()
    paths, released = references(Path(solutions))
    setup = HomeworkSetup.for_solutions(Path(solutions), require_commits=options.require_commits,
                                        limits=options.homework_limits) if options.homework else None
    if setup:
        released.pop(HOMEWORK, None)   # graded by its scripts, never in a kernel
    if options.sandbox:
        check_available(options.limits)
        _check_hidden([Path(solutions), *submissions] + ([report] if report else []))
    for notebook in released.values():  # import the outside checks' modules now, not while kernels run
        for cell in notebook.cells:
            if tagged(cell, CHECK) and (o := outside_check(cell_source(cell))):
                __import__(o.module)
    items, findings = collect(list(submissions), paths, set(released), HOMEWORK if setup else None)
    items, findings = _shard(items, findings, shard)
    out = Report(report, resume) if report else None
    if out:
        out.write_files(findings)
    todo = [i for i in items if not out or Grade(i.learner, i.reference.name).key not in out.done]
    if verbose:
        print(f"{len({i.learner for i in items})} 位学员,{len(items)} 个 notebook 行,待批改 {len(todo)} 个;"
              f"{'沙箱: bubblewrap' if options.sandbox else '未沙箱(--no-sandbox)'};并行 {options.jobs}",
              file=sys.stderr, flush=True)
    scripts: dict[str, dict[str, str]] = {}
    grades = asyncio.run(_grade_items(todo, released, options, out, verbose, setup, scripts))
    everything = sorted(out.grades if out else grades, key=lambda g: g.key)
    if out:
        out.finish(everything)
    if setup:
        _similarity([i for i in items if i.reference.name == HOMEWORK], setup, scripts, report, verbose)
    return everything


def _similarity(items: list[Item], setup: HomeworkSetup, scripts: dict[str, dict[str, str]], report: Path | None,
                verbose: bool) -> None:
    """grades.similarity.csv and its terminal summary, over every learner's scripts (read again where resumed)."""
    from course_tools.grade.similarity import pair_rows, summary, write_csv

    private = private_dir()
    try:
        learners = {i.learner: scripts[i.learner] if i.learner in scripts else read_scripts(i, setup, private)
                    for i in items if i.path is not None}
    finally:
        shutil.rmtree(private, ignore_errors=True)
    rows = pair_rows({k: v for k, v in learners.items() if v}, references=setup.reference_scripts(),
                     baseline=setup.baseline_scripts())
    if report:
        write_csv(report.with_name(report.stem + ".similarity.csv"), rows)
    if verbose:
        print(summary(rows), file=sys.stderr)


async def _grade_items(items: list[Item], released: dict, options: Options, out: Report | None,
                       verbose: bool, setup: HomeworkSetup | None = None,
                       scripts: dict[str, dict[str, str]] | None = None) -> list[Grade]:
    from tqdm.auto import tqdm

    private = private_dir()
    semaphore = asyncio.Semaphore(max(1, options.jobs))
    bar = tqdm(total=len(items), unit="nb", disable=not verbose or not items, file=sys.stderr, dynamic_ncols=True)
    grades: list[Grade] = []

    async def one(item: Item) -> None:
        async with semaphore:
            start = time.perf_counter()
            try:
                if setup and item.reference.name == HOMEWORK:
                    result = await asyncio.to_thread(grade_homework, item, setup, sandbox=options.sandbox,
                                                     private=private)
                    grade = result.grade
                    if scripts is not None:
                        scripts[item.learner] = result.scripts
                else:
                    grade = await grade_item(item, released[item.reference.name], options, private)
            except Exception as exc:  # noqa: BLE001 - a grader bug must not stop the others; the total stays
                reason = f"评分出错: {type(exc).__name__}: {clean_text(exc, 200)}"
                if item.reference.name in released:
                    ref_checks = [c for c in released[item.reference.name].cells if tagged(c, CHECK)]
                    grade = Grade(item.learner, item.reference.name, total=len(ref_checks), notes=[reason],
                                  checks=[CheckOutcome(str(c.get("id")), False, "评分出错") for c in ref_checks])
                else:
                    grade = failed_grade(item, reason)
            grades.append(grade)
            if out:
                out.add(grade)
            if verbose:
                bar.write(f"  {safe_field(grade.learner, 60)} / {grade.notebook}: {grade.passed}/{grade.total}"
                          f" ({time.perf_counter() - start:.0f} s)")
            bar.update(1)

    try:
        await asyncio.gather(*(one(i) for i in items))
    finally:
        bar.close()
        shutil.rmtree(private, ignore_errors=True)
    return grades


# ---------------------------------------------------------------- command line

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        p = argparse.ArgumentParser(prog="python -m course_tools.grade merge",
                                    description="Combine the reports of --shard runs into one.")
        p.add_argument("inputs", nargs="+", type=Path, help="the shards' grades CSV files")
        p.add_argument("--report", type=Path, required=True, help="the combined CSV to write")
        args = p.parse_args(argv[1:])
        try:
            grades = merge_reports(args.inputs, args.report)
        except (ValueError, OSError) as exc:
            print(f"无法合并: {exc}", file=sys.stderr)
            return 2
        print(table(grades))
        print(f"\n{pass_rate_table(grades)}\n\nwrote {args.report}")
        return 0
    p = argparse.ArgumentParser(prog="python -m course_tools.grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("submissions", nargs="+", type=Path, help="notebooks, learner folders, or class folders")
    p.add_argument("--report", type=Path, default=None, help="CSV to write (also .checks.csv, .files.csv, "
                   ".pass_rate.csv and a _feedback/ folder next to it)")
    p.add_argument("--solutions", type=Path, default=ROOT / "solutions", help="reference notebooks (default: solutions/)")
    d = Options()
    p.add_argument("--cell-timeout", type=float, default=d.cell_timeout,
                   help=f"CPU seconds per cell; a cell that sleeps is stopped after {WALL_FACTOR}x this in wall time "
                        f"(default {d.cell_timeout:g})")
    p.add_argument("--timeout", type=float, default=d.timeout,
                   help=f"hard limit per notebook in CPU seconds, all reruns included; {WALL_FACTOR}x this in wall time "
                        f"at most (default {d.timeout:g})")
    p.add_argument("--jobs", type=int, default=d.jobs, help=f"notebooks graded at the same time (default {d.jobs})")
    p.add_argument("--shard", type=_shard_arg, default=None, help="K/N: grade only the K-th of N parts of the learners")
    p.add_argument("--resume", action="store_true", help="keep the rows already in --report, grade the rest")
    p.add_argument("--memory", type=_size_arg, default=d.limits.memory,
                   help=f"address-space limit per process (default {d.limits.memory / GiB:g}G)")
    p.add_argument("--no-sandbox", action="store_true", help="run learner code WITHOUT the bubblewrap sandbox")
    p.add_argument("--run-flagged", action="store_true", help="run exercises flagged for review instead of stubbing them")
    p.add_argument("--require-commits", action="store_true",
                   help="homework: a history that fails the commit-discipline verdict scores 0 (default: reported only)")
    p.add_argument("--no-homework", action="store_true", help="grade the notebooks only, not the homework scripts")
    args = p.parse_args(argv)
    if args.resume and not args.report:
        p.error("--resume 需要 --report")
    options = Options(cell_timeout=args.cell_timeout, timeout=args.timeout, jobs=max(1, args.jobs),
                      sandbox=not args.no_sandbox, limits=Limits(memory=args.memory), run_flagged=args.run_flagged,
                      homework=not args.no_homework, require_commits=args.require_commits)
    try:
        grades = grade_all(args.submissions, args.solutions, options, args.report, args.shard, args.resume)
    except SandboxUnavailable as exc:
        print(f"无法启动沙箱: {exc}", file=sys.stderr)
        return 2
    except AuthoringError as exc:
        print(f"参考 notebook 有编写错误: {exc}", file=sys.stderr)
        return 2
    print(table(grades))
    print(f"\n{pass_rate_table(grades)}")
    if args.report:
        print(f"\nwrote {args.report} (+ .checks.csv, .files.csv, .pass_rate.csv, .similarity.csv, "
              f"{args.report.stem}_feedback/)")
    return 0

