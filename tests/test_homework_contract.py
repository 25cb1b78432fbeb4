"""What each homework check uses is written in the contract blocks of 10_homework.ipynb (issue 13, item 1).

Each check runs once against a recording fake script (torch-free, meets the contract). An audit hook
records the command line of every script the check starts and every file it reads back; the check's
lookups in metrics.jsonl records and config.json are recorded too. Then:

- every flag, file, record key and config key the check used appears in a contract block (### 约定)
  at or before the check's section;
- every command line the check ran is shown, verbatim, in its own section's contract block
  (the run folder shown as DIR);
- each upgrade section ends in its contract block, right before the check cell.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from course_tools.checks import untrusted_files as homework_files
from course_tools.checks import nb10_homework as homework
from course_tools.checks.homework_runs import RECORDS
from course_utils.resume_doctor import probe
from tests.support.homework_scripts import fake_overfit_pair, fake_train
from tests.support.notebook_cells import ROOT

NOTEBOOK = ROOT / "solutions" / "10_homework.ipynb"
CHECKS = [u.check.__name__ for u in homework.UPGRADES]


@dataclass
class Used:
    commands: set[str] = field(default_factory=set)
    flags: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)


_active: dict[str, object] = {}  # the recording in progress: {"root": str, "used": Used}


def _audit(event: str, args: tuple) -> None:
    active = _active.get("used")
    if active is None:
        return
    if event == "subprocess.Popen":
        argv = [str(a) for a in args[1]]
        if len(argv) >= 4 and argv[1] == probe.__file__:  # the resume doctor's probe: the script's own command follows --
            argv = [argv[0], *argv[argv.index("--") + 1:]]
        if len(argv) >= 2 and argv[1].endswith(".py"):
            shown = ["python", Path(argv[1]).name]
            for prev, arg in zip(argv[1:], argv[2:]):
                # the epoch-end kill checkpoints every epoch: the contract calls that length E
                shown.append("DIR" if prev == "--out" else "E" if prev == "--ckpt-every-steps" and arg != "10" else arg)
            active.commands.add(" ".join(shown))
            active.flags.update(a for a in argv[2:] if a.startswith("--"))
    elif event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, os.PathLike)) or not str(path).startswith(_active["root"]):
            return
        reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else not flags & (os.O_WRONLY | os.O_RDWR)
        # the logs are the check's own capture of the output; directories are opened to be removed
        # and the resume doctor's records are the check's own (written by the probe in the script's process)
        if reading and not str(path).endswith(".log") and RECORDS not in Path(path).parts and os.path.isfile(path):
            active.files.add(Path(path).name)


sys.addaudithook(_audit)  # audit hooks cannot be removed; it records only while _active is set


class _RecordingDict(dict):
    """A metrics record that remembers which keys the check looked at."""

    def __init__(self, data: dict, used: Used) -> None:
        super().__init__(data)
        self._used = used

    def __getitem__(self, key):
        self._used.keys.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._used.keys.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._used.keys.add(key)
        return super().__contains__(key)


def _record(monkeypatch, tmp_path: Path, check: str) -> Used:
    used = Used()
    real_read, real_config = homework_files.read_records, homework_files.config_values
    monkeypatch.setattr(homework_files, "read_records",
                        lambda path: [_RecordingDict(r, used) if isinstance(r, dict) else r for r in real_read(path)])

    def config_values(obj, name, substring=False):
        used.keys.add(name)
        return real_config(obj, name, substring)

    monkeypatch.setattr(homework_files, "config_values", config_values)
    scratch = tmp_path / "check"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    scripts = tmp_path / "scripts"
    _active.update(root=str(scratch), used=used)
    try:
        if check == "check_overfit":
            homework.check_overfit(*fake_overfit_pair(scripts))
        else:
            getattr(homework, check)(fake_train(scripts))
    finally:
        _active.clear()
    return used


@pytest.fixture(scope="module")
def notebook():
    """(contract blocks in order, {check name: index of its section's block})."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    blocks, section = [], {}
    for k, cell in enumerate(cells):
        if cell.cell_type == "markdown" and cell.source.startswith("### 约定"):
            blocks.append(cell.source)
        m = re.match(r"(check_\w+)\(", cell.source) if cell.cell_type == "code" else None
        if m:
            before = cells[k - 1]
            assert before.cell_type == "markdown" and before.source.startswith("### 约定"), \
                f"{m.group(1)}: the cell before the check is not its contract block"
            section[m.group(1)] = len(blocks) - 1
    assert sorted(section) == sorted(CHECKS) and sorted(section.values()) == list(range(len(CHECKS)))
    return blocks, section


def _tokens(text: str) -> set[str]:
    """Words inside the code spans and code blocks of ``text``: flags, file names, keys."""
    code = re.findall(r"```.*?```|`[^`\n]+`", text, flags=re.DOTALL)
    return set(re.findall(r"--[a-z][a-z-]*|[A-Za-z_][\w.]*", " ".join(code)))


def _command_lines(text: str) -> set[str]:
    return {line.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
            for line in block.splitlines() if line.strip().startswith("python ")}


@pytest.mark.parametrize("check", CHECKS)
def test_what_the_check_uses_is_in_the_contract(check, notebook, monkeypatch, tmp_path):
    blocks, section = notebook
    used = _record(monkeypatch, tmp_path, check)
    assert used.commands and used.files and used.keys, f"{check}: nothing recorded: {used}"
    own = blocks[section[check]]
    # the overfit scripts are new files: their block states everything they need on its own
    visible = own if check == "check_overfit" else "\n".join(blocks[:section[check] + 1])
    tokens = _tokens(visible)
    missing = sorted((used.flags | used.files | used.keys) - tokens)
    assert not missing, f"{check} uses {missing}, not in the contract blocks up to its section"
    shown = _command_lines(own)
    assert used.commands <= shown, f"{check} runs {sorted(used.commands - shown)}; its block shows {sorted(shown)}"


def test_recording_sees_what_a_check_reads(monkeypatch, tmp_path):
    """The instrument itself: check_config reads config.json and metrics.jsonl and looks up seed/commit."""
    used = _record(monkeypatch, tmp_path, "check_config")
    assert {"config.json", "metrics.jsonl"} <= used.files
    assert {"seed", "commit", "step", "loss"} <= used.keys
    assert {"--out", "--seed", "--max-steps"} <= used.flags
    assert any(c.startswith("python train_cifar.py --out DIR --seed 1234 ") for c in used.commands)
