"""Whether a homework upgrade has been started, found in seconds, so that 10 opens calm.

On the untouched baseline each of 10's checks would run the script for 4-28 s and then report ``unrecognized
arguments: --out ...``, which reads like breakage. In a learner's own Jupyter (:func:`course_tools.checks.calm`) a
check first asks the script for its ``--help``: when it lists none of the flags an upgrade adds (``UpgradeInfo.flags``),
or the script does not exist yet, the check reports :class:`~course_tools.checks.NotStarted` ("升级 N 还没开始")
without training; a ``--help`` that fails, hangs or prints no usage proves nothing. Under ``COURSE_CHECKS=strict``
:func:`started` does nothing, so no verdict changes; the grader's commit walk (:mod:`course_grader.upgrades`) uses
:func:`help_text` in its sandbox only to skip older commits that have not started an upgrade. Example::

    script = started("notebooks/homework/train_cifar.py", 3)   # the baseline: raises NotStarted
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from course_tools.checks import calm, not_started
from course_tools.checks.homework_runs import LOCAL, Launcher, run_environ, script_path
from course_tools.checks.upgrades import UPGRADE_LIST

__all__ = ["help_text", "listed_flags", "flags_in", "started"]

HELP_TIMEOUT = 30.0  # seconds: the script imports torch before its parser answers
_MAX_HELP = 1 << 20  # characters of a --help output read


def help_text(script: Path, launcher: Launcher = LOCAL, timeout: float = HELP_TIMEOUT) -> str | None:
    """What ``python script --help`` prints, run through ``launcher`` (the grader's is its sandbox); None when
    it fails, hangs past ``timeout`` or prints no usage."""
    with tempfile.TemporaryDirectory(prefix="help") as tmp:
        log = Path(tmp) / "help.log"
        try:
            with open(log, "w", encoding="utf-8") as out:
                proc = launcher([sys.executable, str(script), "--help"], cwd=script.parent, env=run_environ(),
                                stdout=out, writable=Path(tmp))
                try:
                    code = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(OSError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return None
        except OSError:
            return None
        text = log.read_text(encoding="utf-8", errors="replace")[:_MAX_HELP]
    return text if code == 0 and "usage:" in text else None


def listed_flags(script: Path, flags: tuple[str, ...], timeout: float = HELP_TIMEOUT,
                 launcher: Launcher = LOCAL) -> set[str] | None:
    """The ``flags`` that ``python script --help`` lists; None when the help does not answer with a usage."""
    text = help_text(script, launcher, timeout)
    return None if text is None else flags_in(text, flags)


def flags_in(help_output: str, flags: tuple[str, ...]) -> set[str]:
    """The ``flags`` a ``--help`` output lists (``--clip`` is not ``--clip-grad``)."""
    return {flag for flag in flags if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_output)}


def started(path: str | Path, number: int) -> Path:
    """The resolved script of upgrade ``number`` (as :func:`script_path`); in a learner's Jupyter, first
    :class:`NotStarted` when the upgrade has plainly not been started (no script yet, or none of its
    flags). The hint names what to add; the calm note itself says to run the check again."""
    upgrade = UPGRADE_LIST[number - 1]
    where = "notebooks/homework/"
    if calm() and not Path(path).exists():
        not_started(f"升级 {number} 还没开始:还没有 {Path(path).name}", f"在 {where} 里新建它")
    script = script_path(path)
    if calm() and upgrade.flags and listed_flags(script, upgrade.flags) == set():
        not_started(f"升级 {number} 还没开始:{script.name} 还不认识 {' '.join(upgrade.flags)}",
                    f"按本节的约定在 {where}{script.name} 里加上这些参数")
    return script
