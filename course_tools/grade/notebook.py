"""The notebook step: one learner x one reference notebook, from :class:`Item` to :class:`Grade`.

Part of :mod:`course_tools.grade`. :func:`grade_item` reads the submission and builds the notebook to
run (:mod:`course_tools.grade.plan`; exercises the tamper scan flagged run as stubs unless
``--run-flagged``), runs its code cells in a sandboxed kernel (:mod:`course_tools.grade.kernel`) and,
when a cell times out, loops or kills the kernel, runs it again with the offending exercise (the one
running, or the last one run before the cell that failed) replaced by its stub, at most once per
exercise, so the other exercises keep their marks. Each check cell is then scored from the kernel's
reply, or outside the kernel for the self-test answers (:mod:`course_tools.grade.answers`).

Example::

    grade = asyncio.run(grade_item(item, released["01_amp.ipynb"], Options(), private_dir()))
    grade.passed, grade.total, grade.notes
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import nbformat

from course_tools.cells import CHECK, tagged
from course_tools.cputime import WALL_FACTOR
from course_tools.grade.answers import score_outside
from course_tools.grade.collect import Item
from course_tools.grade.kernel import DEADLINES, Budget, CellResult, RunResult, run_cells
from course_tools.grade.options import Options
from course_tools.grade.plan import Plan, UnreadableNotebook, cell_source, make_plan, read_notebook
from course_tools.grade.report import CheckOutcome, Grade
from course_tools.sandbox import GiB, KernelBox

__all__ = ["grade_item"]


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


async def _run(plan: Plan, stubbed: dict[int, str], options: Options, private: Path, budget: Budget) -> RunResult:
    cells = [(i, plan.stubs[i] if i in stubbed else cell_source(c)) for i, c in enumerate(plan.notebook.cells)
             if c.get("cell_type") == "code" and cell_source(c).strip()]
    box = KernelBox(private, options.limits, options.threads, options.sandbox)
    try:
        return await run_cells(cells, box, cell_timeout=options.cell_timeout, budget=budget, grace=options.grace)
    finally:
        box.close()


def _stub_flagged(plan: Plan, options: Options, grade: Grade) -> dict[int, str]:
    """Exercise index -> why it runs as its stub: those the tamper scan flagged (none with ``--run-flagged``)."""
    stubbed: dict[int, str] = {}
    for index, flags in plan.flags.items():
        text = "; ".join(str(f) for f in flags)
        grade.review.append(f"{plan.label(index)}: {text}")
        if options.run_flagged:
            grade.notes.append(f"需人工检查: {plan.label(index)}: {text}(--run-flagged: 照常运行)")
        else:
            stubbed[index] = f"需人工检查,{plan.label(index)} 未运行,暂按 0 分: {text}"
            grade.notes.append(stubbed[index])
    return stubbed


async def _run_until_done(plan: Plan, stubbed: dict[int, str], options: Options, private: Path,
                          grade: Grade) -> tuple[dict[int, CellResult], str]:
    """Run the notebook, again with each offending exercise stubbed (``stubbed`` grows): the check cells'
    results, and why the last run ended early ("" when it ran to the end)."""
    outcomes: dict[int, CellResult] = {}
    budget = Budget(options.timeout)
    while True:
        result = await _run(plan, stubbed, options, private, budget)
        if result.startup_error:
            ended = f"内核无法启动: {result.startup_error}"
            grade.notes.append(ended)
            return outcomes, ended
        outcomes.update({i: r for i, r in result.cells.items() if i in plan.checks})
        stop = result.stop
        if stop is None:
            return outcomes, ""
        event = _event(plan, stop, options)
        offender = stop.index if stop.index in plan.exercises else max(
            (e for e in plan.exercises if e < stop.index), default=None)
        if stop.status in DEADLINES or offender is None or offender in stubbed:
            ended = event + ("" if stop.status in DEADLINES else
                             ";问题不在某个练习里,无法重新运行" if offender is None else ";该练习已按未完成运行过,不再重试")
            grade.notes.append(ended)
            return outcomes, ended
        stubbed[offender] = event
        grade.notes.append(f"{event};重新运行,{plan.label(offender)} 按未完成处理")


async def _score(plan: Plan, stubbed: dict[int, str], outcomes: dict[int, CellResult], ended: str,
                 options: Options, grade: Grade) -> None:
    """One :class:`CheckOutcome` per check cell: from the kernel's reply, or scored outside the kernel."""
    for index in plan.checks:
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


async def grade_item(item: Item, released: nbformat.NotebookNode, options: Options, private: Path) -> Grade:
    """Grade one learner x notebook; never raises for a bad submission."""
    ref_checks = [c for c in released.cells if tagged(c, CHECK)]
    grade = Grade(item.learner, item.reference.name, total=len(ref_checks), notes=list(item.notes),
                  review=list(item.review))
    if not options.sandbox:
        grade.notes.insert(0, "未沙箱运行(--no-sandbox)")

    def unrun(reason: str) -> Grade:
        grade.checks = [CheckOutcome(str(c.get("id") or f"check {k + 1}"), False, reason)
                        for k, c in enumerate(ref_checks)]
        return grade

    if item.path is None:
        return unrun("未提交")
    try:
        submission = read_notebook(item.path)
    except (UnreadableNotebook, OSError) as exc:
        grade.notes.append(f"无法读取: {exc}")
        return unrun(f"无法读取: {exc}")
    plan = make_plan(released, submission)
    grade.notes += plan.notes
    stubbed = _stub_flagged(plan, options, grade)
    outcomes, ended = await _run_until_done(plan, stubbed, options, private, grade)
    await _score(plan, stubbed, outcomes, ended, options, grade)
    grade.passed = sum(c.passed for c in grade.checks)
    return grade
