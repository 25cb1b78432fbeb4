"""The homework handed in, read safely: its history opened (:mod:`.commits`) and its scripts copied out.

Nothing the learner's folder links to is read or run (:func:`copy_scripts`); a bundle's scripts are its head
commit. :data:`HAND_IN` is the command a learner runs to hand in.

Example::

    left = copy_scripts(Path("submissions/alice/homework"), scratch / "head")   # what was left out, and why
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from course_grader.collect import Item
from course_grader.commits import HOMEWORK, History, HistoryError, open_history
from course_grader.sandbox import MiB

if TYPE_CHECKING:
    from course_grader.homework import HomeworkSetup
    from course_grader.steps import Submission

__all__ = ["HAND_IN", "copy_scripts", "digest", "texts", "pin", "open_handed_in", "unreadable", "step", "read_scripts"]

HAND_IN = "git bundle create hw.bundle homework-0.4"

_MAX_FILES = 50
_MAX_FILE = 2 ** 20


def copy_scripts(src: Path, dest: Path) -> list[str]:
    """Copy the regular files directly in ``src`` into the new ``dest``; what was left out, and why. Symlinks,
    folders, hidden files, files over 1 MiB and files past the 50th are never copied."""
    dest.mkdir(parents=True)
    left: list[str] = []
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError as exc:
        return [f"{src.name}: 无法读取 ({exc.strerror})"]
    copied = 0
    for entry in entries:
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if entry.is_symlink():
            left.append(f"{entry.name}: 符号链接,未复制")
        elif not entry.is_file(follow_symlinks=False):
            left.append(f"{entry.name}: 不是普通文件,未复制")
        elif entry.stat(follow_symlinks=False).st_size > _MAX_FILE or copied >= _MAX_FILES:
            left.append(f"{entry.name}: 超过 {_MAX_FILE // MiB} MiB 或 {_MAX_FILES} 个文件的上限,未复制")
        else:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    continue
                (dest / entry.name).write_bytes(f.read(_MAX_FILE + 1)[:_MAX_FILE])
            copied += 1
    return left


def digest(folder: Path) -> str:
    """A hash of the files directly in ``folder`` (names and bytes; hidden files left out)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def texts(folder: Path) -> dict[str, str]:
    """The ``.py`` files directly in ``folder`` (regular files, not links), name -> text."""
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.iterdir())
            if p.suffix == ".py" and p.is_file() and not p.is_symlink()}


def pin(folder: Path, sha: str, objects: Path) -> None:
    """Make ``folder`` a git work tree whose ``HEAD`` is ``sha`` (objects from ``objects``): what the script records."""
    git = folder / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "objects" / "info").mkdir(parents=True)
    (git / "HEAD").write_text(sha + "\n")
    (git / "objects" / "info" / "alternates").write_text(f"{objects}\n")


def open_handed_in(item: Item, setup: HomeworkSetup, scratch: Path, notes: list[str]) -> History | None:
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


def _copy_head(item: Item, scratch: Path, notes: list[str]) -> Path | None:
    """A copy of the working tree's scripts (None for a bundle: its scripts are its head commit)."""
    if item.form == "bundle":
        return None
    head = scratch / "head"
    left = copy_scripts(item.path / HOMEWORK if item.form.startswith("clone") else item.path, head)
    if left:
        notes.append("未复制的文件: " + "; ".join(left))
    return head


def unreadable(sub: Submission, exc: HistoryError) -> None:
    """The row of a hand-in that cannot be read: every upgrade failed with the reason, the later steps skipped."""
    from course_grader.upgrades import UPGRADE_LABELS

    sub.unrun(list(UPGRADE_LABELS), f"无法读取作业: {exc}")
    sub.grade.commits = "无法读取"
    sub.grade.notes.append(f"无法读取作业: {exc}")


def step(sub: Submission) -> None:
    """The homework's first step: ``sub.history`` (or None) and ``sub.head``, the copy of the scripts handed in."""
    try:
        sub.history = open_handed_in(sub.item, sub.setup, sub.scratch, sub.grade.notes)
    except HistoryError as exc:
        return unreadable(sub, exc)
    sub.head = _copy_head(sub.item, sub.scratch, sub.grade.notes)
    return None


def read_scripts(item: Item, setup: HomeworkSetup, private: Path) -> dict[str, str]:
    """The scripts ``item`` hands in (name -> text), read without running anything ({} when there are none)."""
    if item.path is None:
        return {}
    scratch = Path(tempfile.mkdtemp(prefix="hw", dir=private))
    try:
        history = open_handed_in(item, setup, scratch, [])
        head = _copy_head(item, scratch, [])
        return texts(head if head is not None else history.export(history.head, scratch / "bundle-head"))
    except HistoryError:
        return {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
