"""The exercise checks of 08_time_estimate: what is special to them (the chapter's example, no number of the hint
passes, rounded step counts accepted, a crash caught, the digits of a near miss). The contract (solution passes,
stub fails, hints, every typical wrong answer of tests/support/wrong_answers/nb08.py fails naming its mistake)
is in tests/test_exercise_contracts.py, its 50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import math
import re

import nbformat
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb08_time_estimate import check_checkpoint_plan, check_estimate_hours
from course_utils.estimate import training_hours as reference_hours
from course_utils.estimate_ckpt import expected_run
from course_utils.estimate import estimate_training_time
from tests.support.notebook_cells import ROOT, exercise_pairs, run_source, stub_hints

NAME = "08_time_estimate.ipynb"


def _pairs(index: int = 0):
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 2, f"期望 2 个练习(时长估算、检查点间隔;FLOP 和内存的练习在 08b);实际 {len(pairs)}"
    return pairs[index]


def test_solution_gives_the_chapter_example():
    # that the check passes it (default seed, as in the notebook): tests/test_exercise_contracts.py
    solution, _ = _pairs()
    fn = run_source(solution)["estimate_hours"]
    assert math.isclose(fn(10_000, 3, 4, 0.5), 10_000 * 3 / (4 * 0.5 * 3600))


def test_stub_hint_gives_no_number_that_passes():
    # no line of the answer either: tests/test_exercise_contracts.py
    _, stub = _pairs()
    (hint,) = stub_hints(stub)
    for number in re.findall(r"\d+(?:\.\d+)?", hint):   # a constant read off the hint never passes
        with pytest.raises(CheckFailed):
            check_estimate_hours(lambda n, e, b, s, v=float(number): v)


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


# --- §8: checkpoint_plan (issue 53) ---------------------------------------------------------------------------

def test_plan_solution_gives_the_chapter_example():
    solution, _ = _pairs(1)
    tau, yuan = run_source(solution)["checkpoint_plan"](4.2, 2.4, 120, 10, 120)
    ref = expected_run(4.2 * 3600, 10, 120, 7200, 2.4)
    assert math.isclose(tau, math.sqrt(2 * 10 * 7200)) and math.isclose(yuan, ref.yuan)
    assert 6 < tau / 60 < 7 and 10.08 < yuan < 11   # ~6.3 min; a little more than the uninterrupted 10.08 yuan


def test_plan_stub_hint_gives_no_number_that_passes():
    _, stub = _pairs(1)
    (hint,) = stub_hints(stub)
    numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", hint)]
    for a in numbers:
        for b in numbers:
            with pytest.raises(CheckFailed):
                check_checkpoint_plan(lambda *args, a=a, b=b: (a, b))


def test_plan_daly_is_not_young():
    """The exercise asks for Young's interval: Daly's refinement is off by more than 2% on some case."""
    from course_utils.estimate_ckpt import daly_interval

    def daly(w, p, m, c, r):
        run = expected_run(w * 3600, c, r, m * 60, p, interval_s=daly_interval(c, m * 60))
        return run.interval_s, run.yuan
    with pytest.raises(CheckFailed, match="τ\\*"):
        check_checkpoint_plan(daly)


@pytest.mark.parametrize("factor", [1.021, 0.979])
def test_plan_near_miss_prints_digits_that_differ(factor):
    def off(w, p, m, c, r):
        run = expected_run(w * 3600, c, r, m * 60, p)
        return run.interval_s, run.yuan * factor
    with pytest.raises(CheckFailed) as info:
        check_checkpoint_plan(off)
    assert "2% 以内" in info.value.expected
    assert re.search(r"([\d.e+]+) 元", info.value.expected).group(1) != re.search(r"([\d.e+]+) 元", info.value.found).group(1)
