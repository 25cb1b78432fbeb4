"""The learner's homework files: copied out of the submission safely, hashed, read, pinned to a commit.

Part of the homework step (:mod:`course_tools.grade.homework`). :func:`copy_scripts` copies the
regular files handed in into the grader's scratch folder (no symlinks, no folders, no hidden files,
at most 50 files of at most 1 MiB each), so nothing the learner's folder links to is ever read or run;
:func:`texts` reads the scripts for the similarity report; :func:`digest` tells whether the working
tree equals the last commit; :func:`pin` makes an exported commit's folder a work tree whose ``HEAD``
is that commit (what the scripts record in ``config.json``).

Example::

    left = copy_scripts(Path("submissions/alice/homework"), scratch / "head")   # what was left out, and why
    texts(scratch / "head")["train_cifar.py"]
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from course_tools.sandbox import MiB

__all__ = ["copy_scripts", "digest", "texts", "pin"]

_MAX_FILES = 50
_MAX_FILE = 2 ** 20


def copy_scripts(src: Path, dest: Path) -> list[str]:
    """Copy the regular files directly in ``src`` into the new folder ``dest``; what was left out, and why.

    Symlinks, folders, hidden files, files over 1 MiB and files past the 50th are never copied.
    """
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
