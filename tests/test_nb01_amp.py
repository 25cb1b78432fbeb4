"""Notebook 01 (AMP): what is special to its checks. The contract (solution passes, stub fails, hints, every
typical wrong answer of tests/support/wrong_answers/nb01.py fails with its fragment, demo cells) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import pytest
import torch

from course_tools.checks import CheckFailed
from course_tools.checks.nb01_amp import check_amp_train_step
from tests.support.notebook_cells import exercise_pairs, run_source, stub_hints

NAME = "01_amp.ipynb"


@pytest.fixture(scope="module")
def pairs():
    found = exercise_pairs(NAME)
    assert len(found) == 2
    return found


def test_amp_step_constant_return_fails():
    with pytest.raises(CheckFailed):
        check_amp_train_step(lambda *args, **kwargs: 1.0)


def test_amp_step_check_leaves_no_device_warnings(pairs, recwarn):
    solution, _ = pairs[0]
    check_amp_train_step(run_source(solution)["amp_train_step"])
    assert not [w for w in recwarn if "GradScaler" in str(w.message) or "autocast" in str(w.message)]


def test_needs_scaler_solution_returns_true_for_fp16(pairs):
    assert run_source(pairs[1][0])["needs_scaler"](torch.float16) is True


def test_stub_hints_contain_no_graded_answer(pairs):
    # needs_scaler's graded answer is "fp16 only", reached through finfo's smallest_normal: the hint names neither
    (hint,) = stub_hints(pairs[1][1])
    assert hint
    for answer in ("float16", "fp16", "bfloat16", "bf16", "smallest_normal", "tiny", "True", "False"):
        assert answer not in hint, answer


def test_helper_agrees_with_the_solution(pairs):
    from course_utils.amp import needs_grad_scaler

    fn = run_source(pairs[1][0])["needs_scaler"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert bool(fn(dtype)) == needs_grad_scaler(dtype)
