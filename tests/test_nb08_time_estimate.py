"""The exercise check of 08_time_estimate: passes on the solution, fails on the stub and on typical mistakes."""
from __future__ import annotations

import math

import pytest

from course_tools.checks.nb08_time_estimate import check_estimate_hours
from course_utils.estimate import training_hours as reference_hours
from course_utils.estimate import estimate_training_time
from tests.notebook_cells import exercise_pairs, run_source

NAME = "08_time_estimate.ipynb"


def _pairs():
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 1, f"期望 1 个练习;实际 {len(pairs)}"
    return pairs[0]


def test_check_passes_on_solution(capsys):
    solution, _ = _pairs()
    fn = run_source(solution)["estimate_hours"]
    for seed in range(5):
        check_estimate_hours(fn, seed=seed)
    check_estimate_hours(fn)  # unseeded, as in the notebook
    assert "✅" in capsys.readouterr().out
    assert math.isclose(fn(10_000, 3, 4, 0.5), 10_000 * 3 / (4 * 0.5 * 3600))


def test_check_fails_on_released_stub():
    _, stub = _pairs()
    assert "raise NotImplementedError" in stub and "### BEGIN SOLUTION" not in stub
    fn = run_source(stub)["estimate_hours"]
    with pytest.raises(NotImplementedError):
        fn(10_000, 3, 4, 0.5)
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_estimate_hours(fn)


WRONG_ANSWERS = {
    # the unit trap: steps/s used as if it were samples/s, i.e. the batch size forgotten
    "forgets_batch_size": (lambda n, e, b, s: n * e / s / 3600, "忘了除以 batch_size"),
    "multiplies_steps_per_sec": (lambda n, e, b, s: n * e / b * s / 3600, "乘了上去"),
    "divides_by_batch_twice": (lambda n, e, b, s: n * e / (b * b * s * 3600), "多除了一次"),
    "returns_seconds": (lambda n, e, b, s: n * e / (b * s), "结果是秒"),
    "returns_minutes": (lambda n, e, b, s: n * e / (b * s * 60), "结果是分钟"),
    "ignores_epochs": (lambda n, e, b, s: n / (b * s * 3600), None),
    # a constant tuned to the chapter's example (about 4.17 h)
    "constant_chapter_answer": (lambda n, e, b, s: 10_000 * 3 / (4 * 0.5 * 3600), None),
    "returns_none": (lambda n, e, b, s: None, "返回一个数"),
}


@pytest.mark.parametrize("name", sorted(WRONG_ANSWERS))
def test_check_fails_on_typical_wrong_answers(name):
    fn, hint = WRONG_ANSWERS[name]
    for seed in range(5):
        with pytest.raises(AssertionError) as info:
            check_estimate_hours(fn, seed=seed)
        assert str(info.value).startswith("期望"), str(info.value)
        if hint:
            assert hint in str(info.value), str(info.value)


def test_rounded_step_counts_are_accepted():
    # Whole steps per epoch (ceil or floor) are also a correct way to count.
    ceil_steps = lambda n, e, b, s: math.ceil(n / b) * e / s / 3600
    floor_steps = lambda n, e, b, s: (n // b) * e / s / 3600
    for seed in range(5):
        check_estimate_hours(ceil_steps, seed=seed)
        check_estimate_hours(floor_steps, seed=seed)


def test_check_catches_a_crash():
    def crashes(n, e, b, s):
        raise ZeroDivisionError("boom")

    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_estimate_hours(crashes, seed=0)


def test_reference_matches_course_utils_and_chapter_example():
    assert math.isclose(reference_hours(10_000, 3, 4, 0.5), 30_000 / 7_200)          # ~4.17 h
    assert math.isclose(reference_hours(10_000, 3, 4, 0.5 / 4), 4 * 30_000 / 7_200)  # ~16.7 h
    est = estimate_training_time(10_000, 3, 4, samples_per_sec=0.5, verbose=False)
    assert math.isclose(est.hours, reference_hours(10_000, 3, 4, 0.125))
    assert "单位陷阱" in est.note
