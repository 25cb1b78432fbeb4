"""Fixtures and hooks shared by the test modules (pytest finds them here; no module imports them).

- the ``fresh_interpreter`` mark (the two hooks below): no run forks while a marked test or its fixtures start.
- ``workbook_threads``: torch at the workbook's CPU thread policy for the 50-seed sweeps, restored after.
- ``reference`` / ``reference_3_epochs``: the professional script's uninterrupted runs, made once per
  session in a real interpreter and shared by every xdist worker (``tests/support/pro_runs.shared_run``);
  ``ddp_reference``: its uninterrupted two-process job under torchrun (``tests/support/torchrun_jobs.shared_job``).

See tests/README.md for the launchers, the slow rule and the budgets.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from course_utils.env import configure_cpu_threads
from tests.support.pro_runs import REFERENCE, REFERENCE_3_EPOCHS, REFERENCE_STEPS, shared_run, train_losses
from tests.support.forkserver import fresh_only
from tests.support.torchrun_jobs import TOTAL_STEPS, shared_job


def _fresh_guard(item) -> contextlib.AbstractContextManager:
    """A test marked ``fresh_interpreter`` starts real interpreters only (tests about start-up, imports or the
    environment): while it and the fixtures set up for it run (module- and session-scoped ones made for it
    included), a forked start raises (``tests/support/forkserver.fresh_only``)."""
    return fresh_only(item.nodeid) if item.get_closest_marker("fresh_interpreter") else contextlib.nullcontext()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _fresh_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _fresh_guard(item):
        return (yield)


@pytest.fixture
def workbook_threads():
    """Run torch with the workbook's CPU thread policy, then restore the previous setting.

    The sweeps run thousands of tiny steps; on a busy 2-core machine the default of one
    thread per core made them 30-60x slower than one thread (EMA check: 1.5-3 s vs 0.05 s).
    """
    before = torch.get_num_threads()
    configure_cpu_threads(torch.device("cpu"))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The tiny uninterrupted run the kill, misuse and storm tests compare with."""
    out = shared_run(tmp_path_factory, "pro-reference", REFERENCE)
    assert [s for s, _ in train_losses(out)] == list(range(1, REFERENCE_STEPS + 1))
    return out


@pytest.fixture(scope="session")
def reference_3_epochs(tmp_path_factory) -> Path:
    """The three-epoch uninterrupted run (epoch boundaries, best checkpoint)."""
    return shared_run(tmp_path_factory, "pro-reference-3-epochs", REFERENCE_3_EPOCHS)


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory) -> Path:
    """The uninterrupted job of 2 gloo ranks under one torchrun (``torchrun_jobs.ARGS``) that the torchrun kill,
    hang and two-launcher tests compare with."""
    out = shared_job(tmp_path_factory, "pro-ddp-reference")
    assert [s for s, _ in train_losses(out)] == list(range(1, TOTAL_STEPS + 1))
    return out
