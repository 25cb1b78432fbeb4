"""The resume doctor's runs: the command line, one process under the probe, the chains of kills and resumes.

What: :func:`parse_command` splits the learner's command (``{out}``: the run folder; one ``[...]``
argument: what only resumed runs add); :func:`run_process` runs it once under
``probe.py`` (recorded, killed after an exact step or not) and reads what it recorded;
:func:`kill_plan` picks the kill points from the uninterrupted run's epochs; :func:`run_chain`
runs one kill-and-resume chain in one folder.

Why a chain reuses its folder: a resume reads what the killed process left there (its checkpoints),
exactly as a learner's ``--resume`` after ``kill -9``.

Pitfall: the kill comes inside optimizer step K, before the script logs or saves step K; a resume
goes back to the script's newest checkpoint, wherever it is. The doctor finds that step from the
weights the resumed process starts with (:mod:`course_utils.resume_doctor.compare`).

Reference machinery of the resume doctor, which the homework checks share
(``course_tools/checks/homework_resume.py``).

Example::

    cmd = parse_command(["python", "train.py", "--out", "{out}", "[--resume]"])
    ref = run_process(cmd, Path("w/ref"), 0, resumed=False, kill=None)
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.resume_doctor.forks import ForkServer

__all__ = ["PROBE", "Command", "Proc", "UsageError", "parse_command", "run_process", "parse_records", "read_records", "kill_plan",
           "run_chain"]

PROBE = Path(__file__).resolve().with_name("probe.py")
_PYTHON = re.compile(r"^python[\d.]*$")
_PY_FLAGS_WITH_VALUE = {"-X", "-W"}


class UsageError(Exception):
    """The command line cannot be run as the doctor needs (exit 2)."""


@dataclass
class Command:
    python: list[str]        # the interpreter and its own flags
    target: list[str]        # SCRIPT ARG... or -m MODULE ARG..., with {out} and the [...] slot
    resume_at: int | None    # where the [...] arguments go in target, None: nowhere
    resume_args: list[str]

    def argv(self, out: Path, resumed: bool) -> list[str]:
        target = [a.replace("{out}", str(out)) for a in self.target]
        if resumed and self.resume_at is not None:
            target[self.resume_at:self.resume_at] = self.resume_args
        return target


def parse_command(cmd: list[str]) -> Command:
    """``python [FLAGS] (SCRIPT | -m MODULE) ARG...`` with ``{out}`` in some argument and at most one ``[...]``."""
    if not cmd or not (_PYTHON.match(Path(cmd[0]).name) or cmd[0] == sys.executable):
        raise UsageError(f"CMD must start with a Python interpreter (python SCRIPT ... or python -m MODULE ...): {cmd[:1]}")
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] != "-m":
        i += 2 if cmd[i] in _PY_FLAGS_WITH_VALUE else 1
    if i >= len(cmd) or (cmd[i] == "-m" and i + 1 >= len(cmd)):
        raise UsageError("CMD names no script (python SCRIPT ... or python -m MODULE ...)")
    target = list(cmd[i:])
    slots = [k for k, a in enumerate(target) if a.startswith("[") and a.endswith("]")]
    if len(slots) > 1:
        raise UsageError(f"more than one [...] argument: {[target[k] for k in slots]}")
    resume_args = shlex.split(target[slots[0]][1:-1]) if slots else []
    if slots:
        del target[slots[0]]
    if not any("{out}" in a for a in target):
        raise UsageError("CMD must contain {out} (the run folder), e.g. --out {out}: every run needs its own folder")
    return Command(list(cmd[:i]), target, slots[0] if slots else None, resume_args)


@dataclass
class Proc:
    """What one process recorded: the state before its first step, then one record per optimizer step."""

    name: str
    kill: int | None
    returncode: int
    log: Path
    loaded: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    def killed(self) -> bool:
        return self.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)

    def tail(self, lines: int = 8) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def parse_records(text: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The ``loaded`` record and the step records of a probe file's text (a line cut by the kill is skipped)."""
    loaded, steps = None, []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("kind") == "loaded" and loaded is None:
            loaded = rec
        elif isinstance(rec, dict) and rec.get("kind") == "step":
            steps.append(rec)
    return loaded, steps


def read_records(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """:func:`parse_records` of the file at ``path`` (nothing when it does not exist)."""
    return parse_records(path.read_text(encoding="utf-8", errors="replace") if path.exists() else "")


def environ(threads: int) -> dict[str, str]:
    """The runs' environment: the caller's, with ``threads`` CPU threads unless it already sets them."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(key, str(threads))
    return env


def run_process(cmd: Command, folder: Path, index: int, *, resumed: bool, kill: int | None, timeout: float,
                env: dict[str, str], server: ForkServer | None = None) -> Proc:
    """Run ``cmd`` once with ``folder/run`` as ``{out}``, recorded into ``folder/p<index>.jsonl``.

    ``server``: forked from it (torch imported once); None: a fresh interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    record, log = folder / f"p{index}.jsonl", folder / f"p{index}.log"
    probe = ["--record", str(record), *(["--kill", str(kill)] if kill else []), "--", *cmd.argv(folder / "run", resumed)]
    if server is not None:
        code = server.run(probe, log, timeout)
        loaded, steps = read_records(record)
        return Proc(f"p{index}", kill, code if code is not None else -999, log, loaded, steps)
    argv = [*cmd.python, str(PROBE), *probe]
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        else:
            try:  # DataLoader workers and whatever else the killed script left behind
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    loaded, steps = read_records(record)
    return Proc(f"p{index}", kill, code if code is not None else -999, log, loaded, steps)


def train_epochs(steps: list[dict[str, Any]]) -> list[int | None]:
    """Per step, the ordinal of the training loader's iterator that fed it (its epoch in this process)."""
    out = []
    for rec in steps:
        data = rec.get("data") or []
        out.append(data[-1][1] if data else None)
    return out


def kill_plan(ref: Proc, n: int) -> tuple[dict[str, list[int]], int | None, list[str]]:
    """The chains' kill points (each kill counts the steps of its own process), the epoch length, and notes.

    ``mid``: half-way through the first epoch; ``epoch_end``: the first step after the first epoch end
    (its evaluation included); ``twice``: a third into the first epoch, then one epoch of steps later
    in the resumed process (past the next epoch end).
    """
    epochs = train_epochs(ref.steps)
    first = [k for k, e in enumerate(epochs, 1) if e == epochs[0]] if epochs and epochs[0] is not None else []
    epoch = len(first) if first and len(first) < n else None
    notes = []
    base = epoch or n // 2
    plan = {"mid": [base // 2 + 1]}
    if epoch is None:
        notes.append("no epoch end seen (no DataLoader, or one epoch): the epoch-end resume was not tried")
    elif epoch + 1 < n:
        plan["epoch_end"] = [epoch + 1]
    twice = [base // 3 + 1, base]
    if sum(twice) < n:
        plan["twice"] = twice
    else:
        notes.append(f"--steps {n} is too short for two kills in one chain")
    return plan, epoch, notes


def run_chain(cmd: Command, folder: Path, kills: list[int], timeout: float, env: dict[str, str],
              server: ForkServer | None = None) -> list[Proc]:
    """Kill after each of ``kills`` (counted in its own process), resume in the same folder; the last runs to the end."""
    procs = []
    for i in range(len(kills) + 1):
        kill = kills[i] if i < len(kills) else None
        proc = run_process(cmd, folder, i, resumed=i > 0, kill=kill, timeout=timeout, env=env, server=server)
        procs.append(proc)
        if kill is not None and not proc.killed():
            break  # it ended before the kill (or crashed): compare tells
    return procs
