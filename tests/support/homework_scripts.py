"""Learner scripts for the homework-check tests: torch-free fakes and the scripted learner's patches.

- ``fake(folder, kind, **options)``: a two-line script in ``folder`` that runs
  ``tests/fixtures/homework_fake/fake_train.py`` or ``fake_overfit.py`` with a typical
  wrong answer switched on. Checks run against these in about a second.
- ``FORKED`` / ``FORKED_TORCH``: a check's launcher that forks each run from a server that did the
  imports once (the fakes; torch and the course_utils modules learner scripts use) instead of
  starting an interpreter: for the tests of the checks' verdicts (thousands of fakes) and of the
  scripted learner's real training. The tests of how a check launches (its command lines, folders,
  the processes it leaves) use the checks' own ``LOCAL`` launcher.
- ``learner_repo(folder)``: a git repository holding ``notebooks/homework/train_cifar.py``
  as released, where ``apply_upgrade(repo, k)`` applies and commits the scripted learner's
  k-th patch (``UPGRADES[k - 1].patch`` in ``solutions/homework``, the reference answer's commits), as a
  learner commits each upgrade.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import IO

from course_tools.checks.nb10_homework import HEALTHY, TRAIN, TWIN, UPGRADES
from tests.support.forkserver import shared_server
from tests.support.notebook_cells import ROOT

FAKES = ROOT / "tests" / "fixtures" / "homework_fake"
PATCHES = [ROOT / "solutions" / "homework" / u.patch for u in UPGRADES]  # the reference answer's commits
BASELINE = ROOT / "notebooks" / "homework" / "train_cifar.py"
HOMEWORK = Path("notebooks") / "homework"


def fake(folder: Path, name: str, module: str, **options) -> Path:
    """Write ``folder/name`` that calls ``<module>.main(**options)``; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    call = ", ".join(f"{k}={v!r}" for k, v in options.items())
    path = folder / name
    path.write_text(f"import sys\nsys.path.insert(0, {str(FAKES)!r})\nimport {module}\n"
                    f"sys.exit({module}.main({call}))\n", encoding="utf-8")
    return path


# The resume doctor's probe, which the resume and EMA checks run every script through (``probe.py --record ...
# -- SCRIPT``; its ``__main__`` block imports it by this name, as a fresh interpreter does): imported by the server,
# a probed fake costs 22 ms of CPU instead of 49 (the package's import, in every forked run).
PROBE = "course_utils.resume_doctor.probe"
# What the scripted learner's and the reference's scripts import, besides torch: a server that
# imported these forks a run that starts training at once.
LEARNER_IMPORTS = ("torch.nn.functional", "torch.utils.tensorboard", "matplotlib", "course_utils.checkpoint",
                   "course_utils.clipping", "course_utils.data", "course_utils.debug", "course_utils.ema",
                   "course_utils.models", "course_utils.repro", PROBE)


class ForkingLauncher:
    """A ``homework_runs.Launcher`` that forks each run from a server (``tests/support/forkserver.py``) that did the
    imports once, one server per environment a check passes; a server that cannot fork fails the test (a run
    never starts as a real interpreter behind the test's back: the launch tests ask for ``LOCAL``).

    What a forked run does not share with a fresh interpreter is listed in ``tests/support/forkserver.py`` (the
    start-up, the ``str`` hash seed): the tests that exercise those (the launch tests here, the class
    grading, ``solutions/10_homework.ipynb``) start real ones.
    """

    def __init__(self, modules: tuple[str, ...], path: tuple[Path, ...] = (), torch: bool = False) -> None:
        self.modules, self.path, self.torch = modules, path, torch

    def __call__(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO,
                 writable: Path) -> subprocess.Popen:
        server = shared_server(None, modules=self.modules, path=self.path, torch=self.torch, env=env)
        run = server.start(argv[2:], cwd=str(cwd), new_session=True, script=argv[1], env=env, stdout=stdout.fileno())
        if run is None:
            raise RuntimeError(f"the fork server cannot fork ({server.error}): fix it, or use the checks' LOCAL")
        return run


FORKED = ForkingLauncher(("fake_train", "fake_overfit", PROBE), (FAKES,))  # the torch-free fakes
FORKED_TORCH = ForkingLauncher(LEARNER_IMPORTS, torch=True)  # real learner scripts: torch and course_utils imported


def fake_train(folder: Path, level: int = 4, bug: str | None = None, **options) -> Path:
    return fake(folder, TRAIN, "fake_train", level=level, bug=bug, **options)


def fake_overfit_pair(folder: Path, healthy_bug: str | None = None, twin_bug: str | None = None) -> tuple[Path, Path]:
    return (fake(folder, HEALTHY, "fake_overfit", twin=False, bug=healthy_bug),
            fake(folder, TWIN, "fake_overfit", twin=True, bug=twin_bug))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=learner", "-c", "user.email=learner@example.com", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout


def learner_repo(folder: Path) -> Path:
    """A fresh git repository with the released baseline committed."""
    (folder / HOMEWORK).mkdir(parents=True)
    (folder / HOMEWORK / TRAIN).write_text(BASELINE.read_text(encoding="utf-8"), encoding="utf-8")
    _git(folder, "init", "-q")
    _git(folder, "add", ".")
    _git(folder, "commit", "-q", "-m", "baseline (chapter 0.2)")
    return folder


def apply_upgrade(repo: Path, k: int) -> Path:
    """Apply and commit patch ``k`` (1-based); return the folder of the learner's scripts."""
    _git(repo, "apply", str(PATCHES[k - 1]))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", f"upgrade {k}")
    return repo / HOMEWORK
