"""The homework's upgrade checks on a learner's scripts: at the scripts handed in, and at any commit.

Each check runs in the GRADER process and decides the outcome; every run of a learner's script gets its own
:class:`~course_grader.sandbox.ScriptBox`. :class:`_Runner` also serves the commit walk (:mod:`.discipline`):
outcomes memoised per scripts' content, a commit's ``--help`` asked once. What the checks print is dropped per
grading thread (:func:`quiet_checks`), so with ``--jobs`` the terminal keeps the grader's table.

Example::

    _Runner(setup, sandbox=True, scratch=scratch, history=history).check(UPGRADES[1], folder, commit="").passed
"""
from __future__ import annotations

import bisect
import contextlib
import io
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from course_grader.commits import HOMEWORK, Commit, History, HistoryError
from course_grader.hand_in import digest, pin, texts, unreadable
from course_grader.kernel import clean_text
from course_grader.report import CheckOutcome
from course_grader.sandbox import ScriptBox
from course_tools.checks import CheckFailed
from course_tools.checks.homework_started import flags_in, help_text
from course_tools.checks.nb10_homework import TRAIN, UPGRADES, Upgrade, check_config

if TYPE_CHECKING:
    from course_grader.homework import HomeworkSetup
    from course_grader.steps import Submission

__all__ = ["HELP_TIMEOUT", "upgrade_label", "UPGRADE_LABELS", "quiet_checks", "step"]

HELP_TIMEOUT = 20.0  # seconds for a commit's train_cifar.py --help in the walk (it imports torch first)


def upgrade_label(upgrade: Upgrade) -> str:
    """The check column of one upgrade: ``升级 2: 完整检查点 + kill 后续训``."""
    return f"升级 {upgrade.number}: {upgrade.title}"


UPGRADE_LABELS = tuple(upgrade_label(u) for u in UPGRADES)  # the homework row's check columns, in order


class _Runner:
    """Runs upgrade checks for one learner, memoising (commit, upgrade) outcomes."""

    def __init__(self, setup: HomeworkSetup, sandbox: bool, scratch: Path, history: History | None) -> None:
        self.setup, self.sandbox, self.scratch, self.history = setup, sandbox, scratch, history
        self.memo: dict[tuple[str, int], CheckOutcome] = {}         # (commit, upgrade) -> outcome
        self.by_content: dict[tuple[str, int], CheckOutcome] = {}   # (scripts' digest or commit, upgrade) -> outcome
        self.folders: dict[str, Path] = {}
        self.helps: dict[str, str | None] = {}   # commit -> its train_cifar.py --help (None: no usage printed)
        self.runs = 0

    def _box(self, folder: Path, commit: str) -> ScriptBox:
        readable = (self.history.repo / "objects",) if self.history and commit else ()
        return ScriptBox((folder,), readable, self.setup.limits, threads=1, sandbox=self.sandbox)

    def check(self, upgrade: Upgrade, folder: Path, commit: str) -> CheckOutcome:
        """One upgrade's check on the scripts in ``folder``; never raises for the learner's code."""
        box = self._box(folder, commit)
        work = Path(tempfile.mkdtemp(prefix="runs", dir=self.scratch))
        self.runs += 1
        try:
            with quiet_checks():
                message = upgrade.run(folder, launcher=box, workdir=work, commit=commit)
            outcome = CheckOutcome(upgrade_label(upgrade), True, _shown(message, folder))
        except CheckFailed as exc:
            text = _shown(str(exc), folder)
            if "复现" not in text:
                text += f"。复现: 在 10_homework 里运行升级 {upgrade.number} 的检查格子"
            outcome = CheckOutcome(upgrade_label(upgrade), False, text)
        except Exception as exc:  # noqa: BLE001 - a grader bug must not stop the other upgrades
            outcome = CheckOutcome(upgrade_label(upgrade), False,
                                   f"评分出错: {type(exc).__name__}: {clean_text(_shown(str(exc), folder), 300)}")
        finally:
            box.close()
            shutil.rmtree(work, ignore_errors=True)
        for line in box.killed:
            if line not in outcome.message:
                outcome.message += f"({line})"
        return outcome

    def folder(self, commit: Commit) -> Path:
        """The scripts of ``commit``, exported once and pinned to it."""
        if commit.sha not in self.folders:
            dest = self.scratch / f"c-{commit.sha[:12]}"
            self.history.export(commit, dest)
            pin(dest, commit.sha, self.history.repo / "objects")
            self.folders[commit.sha] = dest
        return self.folders[commit.sha]

    @staticmethod
    def content(upgrade: Upgrade, folder: Path, commit: str) -> tuple[str, int]:
        """What a check's outcome depends on: the scripts' bytes (upgrade 1's check also reads the commit)."""
        return (commit if upgrade.check is check_config else digest(folder), upgrade.number)

    def at(self, upgrade: Upgrade, commit: Commit) -> bool:
        """Whether ``upgrade``'s check passes at ``commit``, run once per :meth:`content`."""
        key = (commit.sha, upgrade.number)
        if key not in self.memo:
            try:
                folder = self.folder(commit)
                content = self.content(upgrade, folder, commit.sha)
                if content not in self.by_content:
                    self.by_content[content] = self.check(upgrade, folder, commit.sha)
                self.memo[key] = self.by_content[content]
            except HistoryError as exc:
                self.memo[key] = CheckOutcome(upgrade_label(upgrade), False, f"无法导出 {commit.short}: {exc}")
        return self.memo[key].passed

    def started(self, upgrade: Upgrade, commit: Commit) -> bool:
        """Whether ``commit`` may pass ``upgrade``: its scripts exist and, for an upgrade that adds flags to
        ``train_cifar.py``, its ``--help`` lists one of them (a help without a usage proves nothing: True).
        A commit that has not started an upgrade fails its check, so the walk runs no check there."""
        try:
            folder = self.folder(commit)
        except HistoryError:
            return True   # at() records why the commit cannot be read
        if not all((folder / name).is_file() for name in upgrade.scripts):
            return False
        if not upgrade.info.flags:
            return True
        if commit.sha not in self.helps:
            if None in self.helps.values():   # a script that does not answer --help: stop asking
                return True
            box = self._box(folder, commit.sha)
            try:
                self.helps[commit.sha] = help_text(folder / TRAIN, launcher=box, timeout=HELP_TIMEOUT)
            finally:
                box.close()
        help_output = self.helps[commit.sha]
        return help_output is None or bool(flags_in(help_output, upgrade.info.flags))

    def first_pass(self, upgrade: Upgrade, candidates: list[Commit]) -> Commit | None:
        """The first of ``candidates`` (oldest first) at which the check passes, passing being monotone: the
        commits before the first that :meth:`started` the upgrade fail unrun; that one is tried, then bisection."""
        if not candidates or not self.at(upgrade, candidates[-1]):
            return None
        lo = next((k for k, c in enumerate(candidates[:-1]) if self.started(upgrade, c)), len(candidates) - 1)
        if lo == len(candidates) - 1 or self.at(upgrade, candidates[lo]):
            return candidates[lo]
        # the same halving as a hand-written loop: the first passing commit after ``lo`` (the last one passes)
        return candidates[bisect.bisect_left(candidates, True, lo + 1, len(candidates) - 1,
                                             key=lambda c: self.at(upgrade, c))]


def _shown(text: str, folder: Path) -> str:
    """A message with the grader's scratch path shown as the learner's own folder."""
    return text.replace(str(folder), HOMEWORK)


def _head(sub: Submission, runner: _Runner) -> tuple[Path, str]:
    """The folder of the scripts handed in, and the commit they are (``""``: not a commit)."""
    history = runner.history
    if sub.head is None:          # a bundle: its head commit is what was handed in
        return runner.folder(history.head), history.head.sha
    if history is None:
        return sub.head, ""
    if digest(sub.head) == digest(runner.folder(history.head)):
        return runner.folder(history.head), history.head.sha
    sub.grade.notes.append(f"工作区的脚本与最后一次提交 {history.head.short} 不同: 分数按工作区的脚本;提交历史只用于检查提交纪律")
    return sub.head, ""


def step(sub: Submission) -> None:
    """Each upgrade's check on the scripts handed in (``sub.runner`` keeps the outcomes for the commit walk)."""
    runner = sub.runner = _Runner(sub.setup, sub.sandbox, sub.scratch, sub.history)
    try:
        head, commit = _head(sub, runner)
    except HistoryError as exc:
        return unreadable(sub, exc)
    for upgrade in UPGRADES:
        outcome = runner.check(upgrade, head, commit)
        if commit:
            runner.memo[commit, upgrade.number] = outcome
            runner.by_content[runner.content(upgrade, head, commit)] = outcome
        sub.grade.checks.append(outcome)
        if not outcome.passed:
            sub.grade.notes.append(f"{outcome.check}: {outcome.message}")
    sub.scripts = texts(head)
    return None


class _ThreadStdout(io.TextIOBase):
    """``sys.stdout`` while homework is graded: what the checks print in a grading thread is dropped."""

    def __init__(self, real) -> None:
        self.real = real
        self.local = threading.local()

    def write(self, text: str) -> int:
        return len(text) if getattr(self.local, "quiet", False) else self.real.write(text)

    def flush(self) -> None:
        self.real.flush()


_STDOUT: list[_ThreadStdout] = []


@contextlib.contextmanager
def quiet_checks() -> Iterator[None]:
    """Drop what the checks print (their passed lines) in this thread; the terminal keeps the grader's output."""
    if not _STDOUT or sys.stdout is not _STDOUT[0]:
        _STDOUT[:] = [_ThreadStdout(sys.stdout)]
        sys.stdout = _STDOUT[0]
    proxy = _STDOUT[0]
    proxy.local.quiet = True
    try:
        yield
    finally:
        proxy.local.quiet = False
