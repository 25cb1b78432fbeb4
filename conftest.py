"""Test-session settings shared by the unit tests and the nbval notebook runs.

Set before any kernel starts, so notebook kernels inherit them.
"""
import json
import os
from pathlib import Path

import pytest

from course_tools.claims import STRICT_ENV
from course_tools.noninteractive import quiet_environ

os.environ.update(quiet_environ())  # small sizes, same code path; wandb offline and silent
os.environ.update(STRICT_ENV)       # a notebook sentence contradicted by its own output fails the run


_OURS = "COURSE_TEST_THREADS"  # set beside OMP_NUM_THREADS when this file chose it (a worker may recompute it)


def _share_the_cpu() -> None:
    """Split the workbook's CPU thread policy (cores - 1) among pytest-xdist's workers.

    Exported as ``OMP_NUM_THREADS``, so the notebook kernels, the training scripts and the learner
    scripts the checks start follow it too (``configure_cpu_threads`` honours it). Without it a
    script on torch's default (one thread per core) next to the other worker's run slows down
    about fourfold: its OpenMP threads wait for each other at every operation (``bench/threads.py``).
    A value the caller set is kept.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip() and not os.environ.get(_OURS):
        return
    from course_utils.env import usable_cores
    # In the controller no worker count is known yet (its workers inherit its environment and recompute here)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, (usable_cores() - 1) // workers))
    os.environ[_OURS] = "1"


_share_the_cpu()

# Notebooks that start processes (04's kill-and-resume runs, 05's and 06's DataLoader workers and 05's
# fresh interpreters, 08b's fresh processes for peak memory, 10's homework scripts, 11's torchrun jobs,
# 12's run of the professional script, 13's resume doctor runs): like the tests marked slow, they stay out of the
# quick loop `pytest -m "not slow"` (tests/test_layout.py holds every notebook that starts one to this list).
ROOT = Path(__file__).resolve().parent

SLOW_NOTEBOOKS = {"04_checkpoint_resume.ipynb", "05_reproducibility.ipynb", "06_monitoring.ipynb",
                  "08b_flops_memory.ipynb", "10_homework.ipynb", "11_multi_process.ipynb", "12_loss_spikes.ipynb",
                  "13_resume_doctor.ipynb"}


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (pyproject): one pytest-xdist worker more than the usable cores, at most 8
    (``PYTEST_XDIST_AUTO_NUM_WORKERS``, when set, still decides; ``-n N`` does not call this hook).

    Part of the suite waits instead of computing: sandboxed cells run to their wall-clock backstop, hang
    tests wait for their watchdog, kill tests for the moment to strike. With one worker per core the quiet
    2-core machine sat idle 16% of the run (vmstat); a third worker fills some of it (``bench/suite_time.py``:
    593 s with 2 workers, 541 s with 3). The cap of 8 is a guess: with ``--dist loadfile`` the longest file
    bounds the wall time anyway."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    from course_utils.env import usable_cores
    return min(usable_cores() + 1, 8)


def pytest_configure(config):
    """The tests run checks and small trainings in this process: same CPU thread policy as the notebooks."""
    from course_utils.env import configure_cpu_threads
    configure_cpu_threads()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the notebooks' slow marks must be there
def pytest_collection_modifyitems(session, config, items):
    """Longest files first, so that pytest-xdist's workers (``-n auto --dist loadfile`` in pyproject)
    finish together instead of one waiting for another's last kill test (``file_costs``). The order inside a
    file is kept."""
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb" and path.parent.name == "solutions" and path.name in SLOW_NOTEBOOKS:
            item.add_marker(pytest.mark.slow)
    cost = file_costs(items, *_measured_seconds())
    position = {path: i for i, path in enumerate(dict.fromkeys(str(item.fspath) for item in items))}
    items.sort(key=lambda item: (-cost[str(item.fspath)], position[str(item.fspath)]))


def file_costs(items, files: dict[str, float], tests: dict[str, float]) -> dict[str, float]:
    """Each collected file's expected seconds, from the last ``python bench/suite_time.py``
    (``bench/results/suite_time.json``): ``files`` (seconds per file, path relative to the repository) and
    ``tests`` (its slowest tests, ``file::name``).

    A file costs the larger of its measured time and the sum of its measured tests. In a test module that run did
    not see, a test measured in another module counts under its own name when that name was measured once (a long
    test moved to a file of its own, so that another worker runs it, keeps its place until the next measurement).
    A file with nothing measured goes before every measured one (a new file may be long, and a long file started
    last is the run's tail; a short one started first costs nothing), ordered by what it holds: end-to-end tests
    (``slow``) as long, a notebook (one kernel, cell after cell) as medium, unit tests as short.
    """
    by_name: dict[str, list[float]] = {}
    for test, seconds in tests.items():
        by_name.setdefault(test.split("::", 1)[-1], []).append(seconds)
    measured: dict[str, float] = {}
    summed: dict[str, float] = {}
    guessed: dict[str, float] = {}
    for item in items:
        path = str(item.fspath)
        rel = Path(path).resolve().relative_to(ROOT).as_posix() if Path(path).resolve().is_relative_to(ROOT) else path
        measured.setdefault(path, files.get(rel, 0.0))
        seconds = tests.get(f"{rel}::{item.name}")
        if seconds is None and rel not in files and len(by_name.get(item.name, ())) == 1 and rel.endswith(".py"):
            seconds = by_name[item.name][0]
        if seconds is not None:
            summed[path] = summed.get(path, 0.0) + seconds
        elif rel not in files:
            guess = 60.0 if item.get_closest_marker("slow") else 10.0 if path.endswith(".ipynb") else 1.0
            guessed[path] = max(guessed.get(path, 0.0), guess)
    first = max(files.values(), default=0.0)  # what a file with nothing measured adds to its guess
    return {path: first + guessed[path] if path in guessed and path not in summed
            else max(seconds, summed.get(path, 0.0) + guessed.get(path, 0.0)) for path, seconds in measured.items()}


def _measured_seconds() -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per file and per slowest test of the last suite_time run (``file_costs``); empty without one."""
    try:
        run = json.loads((ROOT / "bench" / "results" / "suite_time.json").read_text(encoding="utf-8"))
        return ({f["file"]: float(f["seconds"]) for f in run["files"]},
                {t["test"]: float(t["seconds"]) for t in run.get("slowest_tests", [])})
    except (OSError, ValueError, KeyError, TypeError):
        return {}, {}
