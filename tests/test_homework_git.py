"""The homework's git commands, exactly as the learner copy of 10 writes them, work after a session.

A fresh clone whose workbook notebooks were saved with outputs (as after working through 01-09) runs
every ``git`` line of 10's code blocks in order, with the reference answer's upgrade applied before
each commit: five commits that hold only ``notebooks/homework/``, and the notebooks stay modified in
the working tree, never in a homework commit.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import nbformat

from course_tools.checks.upgrades import UPGRADE_LIST

ROOT = Path(__file__).resolve().parent.parent
HOMEWORK_PAGE = ROOT / "notebooks" / "10_homework.ipynb"
ENV = {**os.environ, "GIT_AUTHOR_NAME": "learner", "GIT_AUTHOR_EMAIL": "l@example.invalid",
       "GIT_COMMITTER_NAME": "learner", "GIT_COMMITTER_EMAIL": "l@example.invalid"}


def _git_blocks() -> list[list[str]]:
    """The ``git`` lines of each bash block of the learner copy of 10 that has any, in order."""
    blocks = []
    for cell in nbformat.read(HOMEWORK_PAGE, as_version=4).cells:
        if cell.cell_type == "markdown":
            for body in re.findall(r"```bash\n(.*?)```", cell.source, re.S):
                lines = [line.split("#", 1)[0].strip() for line in body.splitlines() if line.startswith("git ")]
                if lines:
                    blocks.append(lines)
    return blocks


def _git(clone: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=clone, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def test_the_homework_commands_commit_only_the_homework_after_a_session(tmp_path):
    clone = tmp_path / "workbook"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    _git(clone, "checkout", "-q", "-B", "main")
    session = clone / "notebooks" / "01_amp.ipynb"                   # a notebook run and saved, with outputs
    nb = nbformat.read(session, as_version=4)
    nb.cells[0].metadata["collapsed"] = False
    nb.cells.append(nbformat.v4.new_code_cell("print('ran')", outputs=[nbformat.v4.new_output("stream", text="ran\n")]))
    nbformat.write(nb, session)
    (clone / "notebooks" / ".progress.json").write_text("{}")        # the ledger: ignored by git

    setup, *commits = _git_blocks()
    assert len(commits) == len(UPGRADE_LIST) and not any("-am" in line or " -a " in line for b in commits for line in b)
    for line in setup:
        out = _git(clone, *shlex.split(line)[1:])
        if line.startswith("git status"):
            assert out == "", out                                   # the step the text prescribes holds
    for upgrade, block in zip(UPGRADE_LIST, commits):
        _git(clone, "apply", str(ROOT / "solutions" / "homework" / upgrade.patch))
        for line in block:
            _git(clone, *shlex.split(line)[1:])
    touched = set(_git(clone, "log", "--format=", "--name-only", "main..HEAD").split())
    assert len(_git(clone, "rev-list", "main..HEAD").split()) == len(UPGRADE_LIST)
    assert touched and all(p.startswith("notebooks/homework/") for p in touched), touched
    assert " M notebooks/01_amp.ipynb" in _git(clone, "status", "--short").splitlines()
