"""The exercise check of 08_time_estimate: passes on the solution, fails on the stub and on typical mistakes.

Each wrong answer is a mistake a learner plausibly makes (the comment says which); the check must
fail on every one with its default seed, and (slow sweep) with 50 other seeds too.
"""
from __future__ import annotations

import math
import re

import nbformat
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb08_time_estimate import check_estimate_hours
from course_utils.estimate import training_hours as reference_hours
from course_utils.estimate import estimate_training_time
from tests.notebook_cells import ROOT, answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import fails_naming, sweep_verdicts

NAME = "08_time_estimate.ipynb"


def _pairs(index: int = 0):
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 1, f"期望 1 个练习(FLOP 和内存的练习在 08b);实际 {len(pairs)}"
    return pairs[index]


def test_check_passes_on_solution(capsys):
    solution, _ = _pairs()
    fn = run_source(solution)["estimate_hours"]
    check_estimate_hours(fn)  # the default seed, as in the notebook
    assert "✅" in capsys.readouterr().out
    assert math.isclose(fn(10_000, 3, 4, 0.5), 10_000 * 3 / (4 * 0.5 * 3600))


def test_check_fails_on_released_stub():
    _, stub = _pairs()
    assert "raise NotImplementedError" in stub and "### BEGIN SOLUTION" not in stub
    fn = run_source(stub)["estimate_hours"]
    with pytest.raises(NotImplementedError):
        fn(10_000, 3, 4, 0.5)
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_estimate_hours(fn)


def test_stub_hint_gives_no_line_of_the_answer_and_no_number_that_passes():
    solution, stub = _pairs()
    (hint,) = stub_hints(stub)
    assert not answer_lines_in(hint, solution, min_chars=0), answer_lines_in(hint, solution, min_chars=0)
    for number in re.findall(r"\d+(?:\.\d+)?", hint):   # a constant read off the hint never passes
        with pytest.raises(CheckFailed):
            check_estimate_hours(lambda n, e, b, s, v=float(number): v)


WRONG_ANSWERS = {
    # the unit trap: steps/s used as if it were samples/s, i.e. the batch size forgotten
    "forgets_batch_size": (lambda n, e, b, s: n * e / s / 3600, "忘了除以 batch_size"),
    # steps/s multiplied instead of divided
    "multiplies_steps_per_sec": (lambda n, e, b, s: n * e / b * s / 3600, "乘了上去"),
    # the batch size divided out twice (once for steps, once "for samples/s")
    "divides_by_batch_twice": (lambda n, e, b, s: n * e / (b * b * s * 3600), "多除了一次"),
    # the batch size in the numerator: samples × batch
    "multiplies_by_batch": (lambda n, e, b, s: n * e * b / (s * 3600), None),
    # seconds or minutes instead of hours
    "returns_seconds": (lambda n, e, b, s: n * e / (b * s), "结果是秒"),
    "returns_minutes": (lambda n, e, b, s: n * e / (b * s * 60), "结果是分钟"),
    # days instead of hours
    "returns_days": (lambda n, e, b, s: n * e / (b * s * 86_400), None),
    # a typo in the seconds per hour
    "divides_by_360": (lambda n, e, b, s: n * e / (b * s * 360), None),
    # one epoch only
    "ignores_epochs": (lambda n, e, b, s: n / (b * s * 3600), None),
    # whole hours: floor division or rounding up to bill by the hour
    "floor_hours": (lambda n, e, b, s: n * e / b / s // 3600, None),
    "ceil_hours": (lambda n, e, b, s: float(math.ceil(n * e / (b * s * 3600))), None),
    # a constant tuned to the chapter's example (about 4.17 h)
    "constant_chapter_answer": (lambda n, e, b, s: 10_000 * 3 / (4 * 0.5 * 3600), None),
    # the number formatted for printing instead of returned
    "returns_string": (lambda n, e, b, s: f"{n * e / (b * s * 3600):.2f}", "返回一个数"),
    # hours and cost together
    "returns_tuple": (lambda n, e, b, s: (n * e / (b * s * 3600), 2.4 * n * e / (b * s * 3600)), "返回一个数"),
    # forgot the return statement
    "returns_none": (lambda n, e, b, s: None, "返回一个数"),
}


def test_rounded_step_counts_are_accepted():
    # Whole steps per epoch (ceil or floor) are also a correct way to count.
    ceil_steps = lambda n, e, b, s: math.ceil(n / b) * e / s / 3600
    floor_steps = lambda n, e, b, s: (n // b) * e / s / 3600
    for seed in (1234, *range(5)):
        check_estimate_hours(ceil_steps, seed=seed)
        check_estimate_hours(floor_steps, seed=seed)


def test_check_catches_a_crash():
    def crashes(n, e, b, s):
        raise ZeroDivisionError("boom")

    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check_estimate_hours(crashes)


def test_reference_matches_course_utils_and_chapter_example():
    assert math.isclose(reference_hours(10_000, 3, 4, 0.5), 30_000 / 7_200)          # ~4.17 h
    assert math.isclose(reference_hours(10_000, 3, 4, 0.5 / 4), 4 * 30_000 / 7_200)  # ~16.7 h
    est = estimate_training_time(10_000, 3, 4, samples_per_sec=0.5, verbose=False)
    assert math.isclose(est.hours, reference_hours(10_000, 3, 4, 0.125))
    assert "单位陷阱" in est.note


@pytest.mark.parametrize("factor", [1.021, 0.979, 1.5])
def test_a_failure_prints_digits_that_differ_and_the_tolerance(factor):
    """Issue 20: a failure whose expected and found values print the same is a defect. Just past 2% the
    printed numbers differ, and the message states the tolerance the notebook's text promises."""
    with pytest.raises(CheckFailed) as info:
        check_estimate_hours(lambda n, e, b, s: reference_hours(n, e, b, s) * factor)
    expected = re.search(r"≈ (\S+) 小时", info.value.expected).group(1)
    found = re.match(r"(\S+) 小时", info.value.found).group(1)
    assert expected != found, str(info.value)
    assert "2% 以内" in info.value.expected
    text = "".join(c.source for c in nbformat.read(ROOT / "solutions" / NAME, as_version=4).cells)
    assert "相对误差 2% 以内" in text


@pytest.mark.parametrize("name", sorted(WRONG_ANSWERS))
def test_check_fails_on_typical_wrong_answers(name):
    fails_naming(check_estimate_hours, *WRONG_ANSWERS[name])


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed():
    sweep_verdicts(check_estimate_hours, run_source(_pairs(0)[0])["estimate_hours"], WRONG_ANSWERS)
