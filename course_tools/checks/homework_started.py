"""Whether a homework upgrade has been started, found in seconds, so that 10 opens calm.

On the untouched baseline each of 10's checks would run the script for 4-28 s and then report
``unrecognized arguments: --out ...``, which reads like breakage. In a learner's own Jupyter
(:func:`course_tools.checks.calm`), a check first asks the script for its ``--help``: when it lists
none of the flags the upgrade adds (``UpgradeInfo.flags``), or the upgrade's script does not exist
yet, the check reports :class:`~course_tools.checks.NotStarted` ("升级 N 还没开始") without training.
A ``--help`` that fails, hangs or prints no usage proves nothing: the check then runs as usual. Under
``COURSE_CHECKS=strict`` (the grader, the tests) nothing here runs, so no verdict changes.

Example::

    script = started("notebooks/homework/train_cifar.py", 3)   # the baseline: raises NotStarted
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from course_tools.checks import calm, not_started
from course_tools.checks.homework_runs import run_environ, script_path
from course_tools.checks.upgrades import UPGRADE_LIST

__all__ = ["listed_flags", "started"]

HELP_TIMEOUT = 30.0  # seconds: the script imports torch before its parser answers


def listed_flags(script: Path, flags: tuple[str, ...], timeout: float = HELP_TIMEOUT) -> set[str] | None:
    """The ``flags`` that ``python script --help`` lists; None when the help does not answer with a usage."""
    try:
        done = subprocess.run([sys.executable, str(script), "--help"], cwd=script.parent, env=run_environ(),
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or "usage:" not in done.stdout:
        return None
    return {flag for flag in flags if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout)}


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
