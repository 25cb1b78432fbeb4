"""Commit discipline of the homework: did each passing upgrade arrive in its own commit, in order?

The checks are cumulative, so "passes" is monotone along the commits that change ``notebooks/homework/``: the walk
(:meth:`~course_grader.upgrades._Runner.first_pass`) needs at most ``1 + ceil(log2(n))`` runs per check. A plain
folder has no history: :data:`NO_HISTORY`, never a penalty.

Example::

    judge_discipline(history.commits, {1: c1, 2: c2, 3: c2, 4: None}).column   # "不合格: 升级 2+3 在同一提交"
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from course_grader.commits import Commit, History, HistoryError
from course_tools.checks.nb10_homework import UPGRADES

if TYPE_CHECKING:
    from course_grader.steps import Submission
    from course_grader.upgrades import _Runner

__all__ = ["Discipline", "NO_HISTORY", "judge_discipline", "step"]


@dataclass(frozen=True)
class Discipline:
    """The verdict on commit discipline: ``ok``, a short Chinese ``column`` for the CSV, ``notes`` for the feedback."""

    ok: bool
    column: str
    notes: list[str] = field(default_factory=list)


NO_HISTORY = Discipline(True, "无历史 (普通文件夹, 不计)", ["交来的是普通文件夹, 没有提交历史: 提交纪律无从检查, 不扣分"])


def judge_discipline(commits: list[Commit], first_pass: dict[int, Commit | None]) -> Discipline:
    """``ok`` when each upgrade's first passing commit (``first_pass``, by upgrade number; None: never passed) is one
    of the learner's ``commits`` (oldest first), shares it with no other upgrade and comes after the previous one's."""
    position = {c.sha: i for i, c in enumerate(commits)}
    notes: list[str] = []
    problems: list[str] = []
    by_commit: dict[str, list[int]] = {}
    previous: tuple[int, int] | None = None     # (upgrade, position) of the last passing upgrade
    for k in sorted(first_pass):
        commit = first_pass[k]
        if commit is None:
            notes.append(f"升级 {k}: 没有一个提交通过它的检查")
            continue
        if commit.sha not in position:
            notes.append(f"升级 {k}: 在 {commit.short} «{commit.subject}» 就已通过, 那不是学员起点之后的提交")
            problems.append(f"升级 {k} 不在学员的提交里")
            continue
        notes.append(f"升级 {k}: {commit.short} «{commit.subject}»")
        by_commit.setdefault(commit.sha, []).append(k)
        if previous is not None and position[commit.sha] < previous[1]:
            notes.append(f"顺序错: 升级 {k} ({commit.short}) 早于升级 {previous[0]} ({commits[previous[1]].short})")
            problems.append(f"升级 {k} 早于升级 {previous[0]}")
        previous = (k, position[commit.sha])
    for sha, upgrades in by_commit.items():
        if len(upgrades) > 1:
            joined = "+".join(map(str, upgrades))
            commit = commits[position[sha]]
            notes.append(f"合并提交 (squashed): 升级 {joined} 都在 {commit.short} «{commit.subject}» 里, 应各自一个提交")
            problems.append(f"升级 {joined} 在同一提交")
    passing = sum(c is not None for c in first_pass.values())
    if problems:
        return Discipline(False, "不合格: " + "; ".join(problems), notes)
    if not passing:
        return Discipline(True, "无可判断 (没有通过的升级)", notes)
    return Discipline(True, f"合格: {passing} 个升级各自一个提交, 顺序正确", notes)


def _discipline(runner: _Runner, history: History | None) -> Discipline:
    """The commit walk: for each upgrade the first of the learner's commits at which its check passes, judged."""
    if history is None:
        return NO_HISTORY
    if not history.commits:
        return Discipline(True, "无学员提交 (起点之后没有提交)", [f"起点之后没有提交: {history.start_note}"])
    candidates = [c for c in history.commits if history.touches_homework(c)]
    for upgrade in UPGRADES:  # the commits after the last candidate leave the head's scripts unchanged
        if candidates and (history.head.sha, upgrade.number) in runner.memo:
            runner.memo.setdefault((candidates[-1].sha, upgrade.number), runner.memo[history.head.sha, upgrade.number])
    before = runner.runs
    verdict = judge_discipline(history.commits, {u.number: runner.first_pass(u, candidates) for u in UPGRADES})
    bound = len(UPGRADES) * (2 + math.ceil(math.log2(max(1, len(candidates)))))
    return Discipline(verdict.ok, verdict.column, [history.start_note, *verdict.notes,
                      f"按提交检查: {len(candidates)} 个改动作业的提交,运行检查 {runner.runs - before} 次(上限 {bound}),"
                      f"--help {len(runner.helps)} 次"])


def step(sub: Submission) -> None:
    """The homework's last step: the verdict into the ``commits`` column and the notes."""
    runner = sub.runner
    try:
        verdict = _discipline(runner, runner.history)
    except HistoryError as exc:
        verdict = Discipline(True, "无法读取", [f"提交历史无法读取: {exc}"])
    sub.grade.commits = verdict.column
    sub.grade.notes += verdict.notes
    sub.runs = runner.runs
