"""Small git histories for the grader's history tests: run git in a clean environment, commit a file, add an upgrade.

Shared by tests/test_grade_history.py, tests/test_grade_commit_notebooks.py and
tests/test_grade_homework.py (test modules import from here, never from each other).
``BASELINE`` is the released ``train_cifar.py`` of the grader's own checkout.

Example::

    git(repo, "init", "-q")
    commit_file(repo, f"{HOMEWORK}/train_cifar.py", BASELINE, "course: homework baseline")
    upgrade(repo, 1)                      # "upgrade 1: feature 1", one line more in train_cifar.py
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from course_grader.commits import HOMEWORK, ROOT

__all__ = ["BASELINE", "ENV", "git", "commit_file", "upgrade"]

BASELINE = (ROOT / HOMEWORK / "train_cifar.py").read_bytes()
ENV = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
       "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}


def git(repo: Path, *args: str, date: int | None = None) -> str:
    """Run git in ``repo`` (no user or system config; ``date``: author and committer time); its stdout."""
    env = dict(ENV)
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date} +0000"
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main",
                           "-c", "protocol.file.allow=always", *args], cwd=repo, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def commit_file(repo: Path, rel: str, text: str | bytes, message: str, date: int | None = None) -> str:
    """Write ``rel`` in ``repo`` and commit it; the new commit's hash."""
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    git(repo, "add", rel)
    git(repo, "commit", "-q", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD")


def upgrade(repo: Path, k: int, message: str | None = None) -> str:
    """The learner's k-th upgrade: a new line in train_cifar.py, committed."""
    script = repo / HOMEWORK / "train_cifar.py"
    text = script.read_text(encoding="utf-8") + f"# upgrade {k}\n"
    return commit_file(repo, f"{HOMEWORK}/train_cifar.py", text, message or f"upgrade {k}: feature {k}")
