"""The class run: every learner x graded notebook and the homework, ``jobs`` at a time, rows written as they finish.

:func:`grade_all` first checks that the sandbox starts and cannot see the references, submissions or report. A
grader bug in one item is that item's row (score 0, its total kept), never the end of the run.

Example::

    grades = grade_all([Path("submissions")], Path("solutions"), Options(jobs=2), report=Path("grades.csv"))
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from course_tools.cells import CHECK, tagged
from course_grader.answers import outside_check
from course_grader.collect import Finding, Item, collect
from course_grader.hand_in import read_scripts, texts
from course_grader.homework import HOMEWORK_LIMITS, NOTEBOOK as HOMEWORK, HomeworkSetup, grade_homework
from course_grader.kernel import clean_text
from course_grader.plan import cell_source, check_labels, references
from course_grader.report import CheckOutcome, Grade, Report, safe_field
from course_grader.sandbox import Limits, SandboxUnavailable, check_available, private_dir, readonly_paths
from course_grader.steps import NOTEBOOK_STEPS, Submission, hooks, run_steps
from course_grader.upgrades import UPGRADE_LABELS

if TYPE_CHECKING:
    import nbformat

    from course_grader.html_report import SimilarPair

__all__ = ["ROOT", "Options", "UnknownLearner", "grade_item", "grade_all"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Options:
    """How notebooks are run: ``cell_timeout``, ``timeout`` CPU seconds per cell and per notebook (all its runs;
    the wall-clock backstop: :mod:`.kernel`), ``grace`` seconds (wall) a cell gets to stop after its interrupt,
    ``steps`` the step modules' own settings by module name (:func:`course_grader.steps.hooks`)."""

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
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        """Torch/OpenMP threads per kernel: the cores shared between the parallel kernels."""
        return max(1, (os.cpu_count() or 1) // self.jobs) if self.jobs > 1 else 0


async def grade_item(item: Item, released: nbformat.NotebookNode, options: Options, private: Path) -> Grade:
    """Grade one learner x notebook; never raises for a bad submission."""
    grade = Grade.fresh(item, len(check_labels(released)), options.sandbox)
    sub = Submission(item, grade, private, options.sandbox, options, options.steps, released=released)
    await run_steps(NOTEBOOK_STEPS, sub)
    return sub.finish()


class UnknownLearner(ValueError):
    """``--only`` named a learner no submission folder has; ``str()`` is the one-line Chinese error."""


def _only(items: list[Item], only: frozenset[str] | None) -> list[Item]:
    """The items to grade: all, or those of the learners in ``only`` (every one of them must exist)."""
    if only is None:
        return items
    unknown = sorted(only - {i.learner for i in items})
    if unknown:
        raise UnknownLearner(f"--only: 提交文件夹里没有学员 {', '.join(safe_field(u, 80) for u in unknown)}")
    return [i for i in items if i.learner in only]


def _shard(items: list[Item], findings: list[Finding], shard: tuple[int, int] | None):
    if shard is None:
        return items, findings
    k, n = shard
    learners = sorted({i.learner for i in items})
    mine = {name for index, name in enumerate(learners) if index % n == k - 1}
    return ([i for i in items if i.learner in mine],
            [f for f in findings if f.learner in mine or (not f.learner and k == 1)])


def _check_hidden(paths: list[Path]) -> None:
    for path in paths:
        resolved = Path(path).resolve()
        for bound in readonly_paths():   # cached
            if resolved == bound or bound in resolved.parents:
                raise SandboxUnavailable(f"{path} 位于沙箱可见的目录 {bound} 里,学员代码能读到它;请把它移到别处")


def grade_all(submissions: list[Path], solutions: Path = ROOT / "solutions", options: Options | None = None,
              report: Path | None = None, shard: tuple[int, int] | None = None, resume: bool = False,
              verbose: bool = True, only: frozenset[str] | None = None) -> list[Grade]:
    """The class run (see the module docstring); ``only``: grade these learners again, keep the report's other rows.
    Raises :class:`SandboxUnavailable` (unless ``options.sandbox`` is False) and :class:`UnknownLearner`."""
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
    regrade = _only(items, only)
    drop = frozenset(Grade(name, "").key[0] for name in only or ())
    out = Report(report, resume or only is not None, drop) if report else None
    if out:
        out.write_files(findings)
    todo = [i for i in regrade if not out or Grade(i.learner, i.reference.name).key not in out.done]
    if verbose:
        print(f"{len({i.learner for i in items})} 位学员,{len(items)} 个 notebook 行,待批改 {len(todo)} 个;"
              f"{'沙箱: bubblewrap' if options.sandbox else '未沙箱(--no-sandbox)'};并行 {options.jobs}",
              file=sys.stderr, flush=True)
    scripts: dict[str, dict[str, str]] = {}
    grades = asyncio.run(_grade_items(todo, released, options, out, verbose, setup, scripts))
    everything = sorted(out.grades if out else grades, key=lambda g: g.key)
    if out:
        out.finish(everything)
    pairs = _similarity([i for i in items if i.reference.name == HOMEWORK], setup, scripts, report,
                        verbose) if setup else []
    if report:
        from course_grader.html_report import check_guide, write_pages

        sections = [finish(report, everything, options.steps) for finish in hooks("finish").values()]
        write_pages(report, everything, check_guide(released), pairs, [s for s in sections if s])
    return everything


def _similarity(items: list[Item], setup: HomeworkSetup, scripts: dict[str, dict[str, str]], report: Path | None,
                verbose: bool) -> list[SimilarPair]:
    """grades.similarity.csv and its terminal summary, over every learner's scripts (read again where resumed);
    the flagged pairs with their shared lines, for the class page."""
    from course_grader.html_report import similar_pairs
    from course_grader.similarity import pair_rows, summary, write_csv

    private = private_dir()
    try:
        learners = {i.learner: scripts[i.learner] if i.learner in scripts else read_scripts(i, setup, private)
                    for i in items if i.path is not None}
    finally:
        shutil.rmtree(private, ignore_errors=True)
    references = setup.reference_scripts()
    baseline = texts(setup.baseline) if setup.baseline.is_dir() else {}   # the released scripts, by name
    rows = pair_rows({k: v for k, v in learners.items() if v}, references=references, baseline=baseline)
    if report:
        write_csv(report.with_name(report.stem + ".similarity.csv"), rows)
    if verbose:
        print(summary(rows), file=sys.stderr)
    return similar_pairs(rows, {**references, **learners}, baseline)


async def _grade_items(items: list[Item], released: dict, options: Options, out: Report | None, verbose: bool,
                       setup: HomeworkSetup | None, scripts: dict[str, dict[str, str]]) -> list[Grade]:
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
                                                     private=private, settings=options.steps)
                    grade, scripts[item.learner] = result.grade, result.scripts
                else:
                    grade = await grade_item(item, released[item.reference.name], options, private)
            except Exception as exc:  # noqa: BLE001 - a grader bug must not stop the others; the total stays
                name = item.reference.name   # every check failed, the total kept
                labels = check_labels(released[name]) if name in released else UPGRADE_LABELS
                grade = Grade.fresh(item, len(labels), options.sandbox)   # notes and review kept, as any row's
                grade.notes.append(f"评分出错: {type(exc).__name__}: {clean_text(exc, 200)}")
                grade.checks = [CheckOutcome(label, False, "评分出错") for label in labels]
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
