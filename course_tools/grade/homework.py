"""Grade the homework of ``10_homework``: each learner's scripts, run by the upgrade checks in sandboxes (instructor tool).

Reference machinery of :mod:`course_tools.grade`. The learner hands in the scripts in one of the
forms :mod:`course_tools.grade.collect` recognises (``homework/`` folder, clone of the workbook with
or without ``.git``, git bundle). The one command a learner runs to hand in, from the workbook's
root after committing each upgrade on the branch ``homework-0.4``::

    git bundle create hw.bundle homework-0.4

For each learner the grader copies the scripts into a scratch folder of its own (regular files
only, no links, size-capped: :mod:`course_tools.grade.homework_files`), then runs each upgrade of
:data:`course_tools.checks.nb10_homework.UPGRADES` in the GRADER process: the check decides the
outcome outside, every run of a learner's script starts through a :class:`~course_tools.sandbox.ScriptBox`
(its own bubblewrap sandbox: the scratch copy's files read-only in a private folder, the run's
own folder the one writable host path, no network, no other learner, no ``solutions/``, memory, pids and disk limits, every
process gone with the sandbox). One row per learner (``passed/total`` = upgrades) and one check
row per upgrade with the check's own message and a command that reproduces it.

History (clone with ``.git``, bundle; read by :mod:`course_tools.grade.commits`): for each
upgrade, the first of the learner's commits at which its check passes. The checks are
cumulative (each upgrade builds on the last, and a learner does not remove one later), so
"passes" is monotone along the commits that change ``notebooks/homework/``. The commits before the
first one that has started the upgrade (its scripts exist and, for an upgrade that adds flags,
``train_cifar.py --help`` lists one: one sandboxed ``--help`` per commit) fail without a run; that
commit is tried next (with one commit per upgrade, the answer), then a binary search: at most
``1 + ceil(log2(n))`` runs of each check for ``n`` such commits besides the run at the head (plus one
at the last commit when the scripts handed in are not a commit), every result memoised per content.
The head's verdicts always come from running the checks (the cut never skips them); the score is their
count, set to 0 only by ``--require-commits`` on a failed commit verdict. A commit's
scripts run in an exported folder whose ``.git`` names that commit as ``HEAD`` (objects read from
the grader's copy of the history), so upgrade 1's check asks for exactly that commit in
``config.json``; without history it asks only for a key naming the commit. The verdict
(:func:`~course_tools.grade.discipline.judge_discipline`) goes into the ``commits`` column and the
notes; it changes the score only with ``require_commits`` (``--require-commits``): a history that
fails the verdict then scores 0 (a plain folder has no history and is never penalised).

Example::

    setup = HomeworkSetup.for_solutions(Path("solutions"))
    result = grade_homework(item, setup, sandbox=True, private=Path(tmp))
    result.grade.passed, result.scripts["train_cifar.py"]
"""
from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from course_tools.checks import CheckFailed
from course_tools.checks.homework_started import flags_in, help_text
from course_tools.checks.nb10_homework import TRAIN, UPGRADES, Upgrade, check_config
from course_tools.grade.collect import Item
from course_tools.grade.commits import HOMEWORK, Commit, History, HistoryError, open_history
from course_tools.grade.discipline import NO_HISTORY, Discipline, judge_discipline
from course_tools.grade.homework_files import copy_scripts, digest, pin, texts
from course_tools.grade.kernel import clean_text
from course_tools.grade.silenced_prints import quiet_checks
from course_tools.grade.report import CheckOutcome, Grade
from course_tools.grade.similarity import PRO_REFERENCE, REFERENCE
from course_tools.sandbox import GiB, MiB, Limits, ScriptBox

__all__ = ["NOTEBOOK", "HAND_IN", "HOMEWORK_LIMITS", "HomeworkSetup", "HomeworkResult", "grade_homework",
           "read_scripts", "failed_grade", "upgrade_label"]

NOTEBOOK = "10_homework.ipynb"
HAND_IN = "git bundle create hw.bundle homework-0.4"
HELP_TIMEOUT = 20.0  # seconds for a commit's train_cifar.py --help in the walk (it imports torch first)
# One script run: torch maps ~3.4 GiB of address space, a tiny run stays under 1 GiB resident; a
# run folder holds a few small checkpoints and logs.
HOMEWORK_LIMITS = Limits(memory=6 * GiB, resident=2 * GiB, pids=256, file_size=256 * MiB, disk=512 * MiB,
                         tmp=256 * MiB, shm=256 * MiB, home=64 * MiB)


def upgrade_label(upgrade: Upgrade) -> str:
    """The check column of one upgrade: ``升级 2: 完整检查点 + kill 后续训``."""
    return f"升级 {upgrade.number}: {upgrade.title}"


@dataclass(frozen=True)
class HomeworkSetup:
    """Where the homework's references are and how it is graded.

    ``reference``: the reference scripts (``solutions/homework``); ``baseline``: the released scripts
    everyone starts from (``notebooks/homework``); ``course``: the course repository (the learner's
    starting commit is its newest commit in the learner's history; None: found from the baseline).
    """

    reference: Path
    baseline: Path
    course: Path | None = None
    require_commits: bool = False
    limits: Limits = HOMEWORK_LIMITS

    @classmethod
    def for_solutions(cls, solutions: Path, **kw) -> "HomeworkSetup | None":
        """``solutions/homework`` and ``solutions/../notebooks/homework``; None when there are no reference scripts."""
        solutions = Path(solutions).resolve()
        reference = solutions / "homework"
        if not reference.is_dir():
            return None
        root = solutions.parent
        return cls(reference, root / HOMEWORK, root if (root / ".git").exists() else None, **kw)

    def reference_scripts(self) -> dict[str, dict[str, str]]:
        """The references a learner's scripts are compared with, by name (:data:`REFERENCE`: the reference
        answer, same file names; :data:`PRO_REFERENCE`: ``train_cifar_pro.py``, standing for ``train_cifar.py``),
        each mapping the LEARNER's file name to the reference's text; a reference with no file is left out."""
        names = dict.fromkeys(n for u in UPGRADES for n in u.scripts)
        paths = {REFERENCE: {name: self.reference / name for name in names},
                 PRO_REFERENCE: {TRAIN: self.reference / "train_cifar_pro.py"}}
        found = {other: {name: path.read_text(encoding="utf-8", errors="replace")
                         for name, path in files.items() if path.is_file()} for other, files in paths.items()}
        return {other: files for other, files in found.items() if files}

    def baseline_scripts(self) -> dict[str, str]:
        """The released scripts everyone starts from, by file name."""
        return texts(self.baseline) if self.baseline.is_dir() else {}


@dataclass
class HomeworkResult:
    """One learner's homework row, the scripts graded (name -> text, for the similarity report) and how many
    check runs it took (the head's and the commit walk's)."""

    grade: Grade
    scripts: dict[str, str] = field(default_factory=dict)
    runs: int = 0


# ---------------------------------------------------------------- running the checks

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
        """Whether ``upgrade``'s check passes at ``commit``: run once per content (the scripts' bytes; for
        upgrade 1, whose check reads the commit itself, per commit)."""
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
        """The first of ``candidates`` (oldest first) at which the check passes, passing being monotone.

        The commits before the first one that has started the upgrade (:meth:`started`) fail without a run;
        that commit is tried next (with one commit per upgrade it is the answer), then a binary search.
        """
        if not candidates or not self.at(upgrade, candidates[-1]):
            return None
        lo = next((k for k, c in enumerate(candidates[:-1]) if self.started(upgrade, c)), len(candidates) - 1)
        if lo == len(candidates) - 1 or self.at(upgrade, candidates[lo]):
            return candidates[lo]
        lo, hi = lo + 1, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.at(upgrade, candidates[mid]):
                hi = mid
            else:
                lo = mid + 1
        return candidates[lo]


def _shown(text: str, folder: Path) -> str:
    """A message with the grader's scratch path shown as the learner's own folder."""
    return text.replace(str(folder), HOMEWORK)


def _unrun(grade: Grade, reason: str) -> None:
    grade.checks = [CheckOutcome(upgrade_label(u), False, reason) for u in UPGRADES]


def failed_grade(item: Item, reason: str) -> Grade:
    """The homework row of a learner whose grading hit a grader bug: every upgrade failed, the total kept."""
    grade = Grade(item.learner, NOTEBOOK, total=len(UPGRADES), notes=[reason])
    _unrun(grade, reason)
    return grade


def grade_homework(item: Item, setup: HomeworkSetup, *, sandbox: bool, private: Path) -> HomeworkResult:
    """Grade one learner's homework (``item.form``/``item.path`` from the collector); never raises for a bad submission."""
    grade = Grade(item.learner, NOTEBOOK, total=len(UPGRADES), notes=list(item.notes), review=list(item.review))
    result = HomeworkResult(grade)
    if not sandbox:
        grade.notes.insert(0, "未沙箱运行(--no-sandbox)")
    if item.path is None:
        _unrun(grade, "未提交作业")
        return result
    scratch = Path(tempfile.mkdtemp(prefix="hw", dir=private))
    try:
        _grade(item, setup, sandbox, scratch, result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    grade.passed = sum(c.passed for c in grade.checks)
    if setup.require_commits and grade.commits and not _discipline_ok(grade):
        grade.notes.append(f"--require-commits: 提交纪律不合格,作业记 0 分(检查本身通过 {grade.passed} 个)")
        grade.passed = 0
    return result


def _discipline_ok(grade: Grade) -> bool:
    return not grade.commits.startswith("不合格")


def _open(item: Item, setup: HomeworkSetup, scratch: Path, notes: list[str]) -> History | None:
    """The learner's history (clone with .git, bundle), or None; a bundle that cannot be read raises HistoryError."""
    if item.form not in ("clone-git", "bundle"):
        return None
    baseline = setup.baseline / "train_cifar.py"
    try:
        return open_history(item.path, scratch / "git", course=setup.course,
                            baseline=baseline.read_bytes() if baseline.is_file() else None)
    except HistoryError as exc:
        if item.form == "bundle":
            raise HistoryError(f"bundle 无法读取: {exc}(交作业: {HAND_IN})") from None
        notes.append(f"提交历史无法读取,按没有历史批改: {exc}")
        return None


def _head(item: Item, runner: _Runner, notes: list[str]) -> tuple[Path, str]:
    """The folder of the scripts handed in, and the commit they are (``""``: not a commit)."""
    history = runner.history
    if item.form == "bundle":
        return runner.folder(history.head), history.head.sha
    src = item.path / HOMEWORK if item.form.startswith("clone") else item.path
    head = runner.scratch / "head"
    left = copy_scripts(src, head)
    if left:
        notes.append("未复制的文件: " + "; ".join(left))
    if history is None:
        return head, ""
    if digest(head) == digest(runner.folder(history.head)):
        return runner.folder(history.head), history.head.sha
    notes.append(f"工作区的脚本与最后一次提交 {history.head.short} 不同: 分数按工作区的脚本;提交历史只用于检查提交纪律")
    return head, ""


def read_scripts(item: Item, setup: HomeworkSetup, private: Path) -> dict[str, str]:
    """The scripts ``item`` hands in (name -> text), read without running anything ({} when there are none)."""
    if item.path is None:
        return {}
    scratch = Path(tempfile.mkdtemp(prefix="hw", dir=private))
    try:
        runner = _Runner(setup, True, scratch, _open(item, setup, scratch, []))
        return texts(_head(item, runner, [])[0])
    except HistoryError:
        return {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _grade(item: Item, setup: HomeworkSetup, sandbox: bool, scratch: Path, result: HomeworkResult) -> None:
    grade = result.grade
    try:
        runner = _Runner(setup, sandbox, scratch, _open(item, setup, scratch, grade.notes))
        head, commit = _head(item, runner, grade.notes)
    except HistoryError as exc:
        _unrun(grade, f"无法读取作业: {exc}")
        grade.commits = "无法读取"
        grade.notes.append(f"无法读取作业: {exc}")
        return
    for upgrade in UPGRADES:
        outcome = runner.check(upgrade, head, commit)
        if commit:
            runner.memo[commit, upgrade.number] = outcome
            runner.by_content[runner.content(upgrade, head, commit)] = outcome
        grade.checks.append(outcome)
        if not outcome.passed:
            grade.notes.append(f"{outcome.check}: {outcome.message}")
    result.scripts = texts(head)
    try:
        verdict = _discipline(runner, runner.history)
    except HistoryError as exc:
        verdict = Discipline(True, "无法读取", [f"提交历史无法读取: {exc}"])
    grade.commits = verdict.column
    grade.notes += verdict.notes
    result.runs = runner.runs


def _discipline(runner: _Runner, history: History | None) -> Discipline:
    if history is None:
        return NO_HISTORY
    if not history.commits:
        return Discipline(True, "无学员提交 (起点之后没有提交)", [f"起点之后没有提交: {history.start_note}"])
    candidates = [c for c in history.commits if history.touches_homework(c)]
    for upgrade in UPGRADES:  # the commits after the last candidate leave the head's scripts unchanged
        if candidates and (history.head.sha, upgrade.number) in runner.memo:
            runner.memo.setdefault((candidates[-1].sha, upgrade.number), runner.memo[history.head.sha, upgrade.number])
    before = runner.runs
    first = {u.number: runner.first_pass(u, candidates) for u in UPGRADES}
    verdict = judge_discipline(history.commits, first)
    bound = len(UPGRADES) * (2 + math.ceil(math.log2(max(1, len(candidates)))))
    return Discipline(verdict.ok, verdict.column, [history.start_note, *verdict.notes,
                      f"按提交检查: {len(candidates)} 个改动作业的提交,运行检查 {runner.runs - before} 次(上限 {bound}),"
                      f"--help {len(runner.helps)} 次"])
