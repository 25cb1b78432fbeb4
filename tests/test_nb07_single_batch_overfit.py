"""07_single_batch_overfit's checks: what is special to them (cases that defeat final-loss thresholds, the
diagnose hint, the global generator left alone, three distinct mystery bugs). The contract of exercises 1-3
(solution passes, stub fails, hints, every typical wrong answer of tests/support/wrong_answers/nb07.py and
nb07_batch_mixing.py fails with its fragment) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks import nb07_single_batch_overfit as checks
from tests.support.notebook_cells import exercise_pairs, run_source
from tests.support.sweep import failure_twice
from tests.support.wrong_answers.nb07 import _DIAGNOSE, WRONG_DIAGNOSE

NAME = "07_single_batch_overfit.ipynb"


@pytest.fixture(scope="module")
def pairs():
    """(solution, stub) sources of each exercise; read when a test runs, so a broken notebook fails tests
    instead of breaking collection."""
    return exercise_pairs(NAME)


def _diagnose(name):
    return run_source(_DIAGNOSE.format(body=WRONG_DIAGNOSE[name]))["diagnose"]


def test_diagnose_cases_defeat_final_loss_thresholds():
    # Each bug's final losses span a range that holds another bug's final loss, so no interval
    # of the final loss (a pair of thresholds) picks out any one bug on these cases.
    curves = checks.diagnose_curves(1234)
    final = {bug: [float(np.mean(c.losses[-10:])) for c in curves if c.bug == bug] for bug in checks.BUGS}
    for bug in checks.BUGS[1:]:
        others = [v for b in checks.BUGS[1:] if b != bug for v in final[b]]
        assert any(min(final[bug]) < v < max(final[bug]) for v in others), (bug, final)


def test_diagnose_failure_names_the_features_and_the_class_count():
    with pytest.raises(CheckFailed) as info:
        checks.check_diagnose(_diagnose("final-loss thresholds"))
    assert "类" in info.value.hint and "grad norm" in info.value.hint


def test_checks_are_deterministic_and_leave_the_global_rng_alone(pairs):
    import torch
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    failure_twice(checks.check_diagnose, _diagnose("final-loss thresholds"))
    checks.check_overfit_one_batch(run_source(pairs[0][0])["overfit_one_batch"])
    assert torch.equal(torch.rand(3), expected)


def test_mystery_functions_hide_three_distinct_bugs(pairs):
    import torch
    from course_utils.models import build_model
    fns = checks.mystery_functions(seed=3)
    assert sorted(fns) == ["mystery_a", "mystery_b", "mystery_c"]
    diagnose = run_source(pairs[1][0])["diagnose"]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    found = set()
    with checks._one_thread():
        for fn in fns.values():
            torch.manual_seed(0)
            found.add(diagnose(*fn(build_model("tiny", width=8), x, y, steps=100)))
    assert len(found) == 3 and "healthy" not in found
