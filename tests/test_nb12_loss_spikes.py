"""The diagnosis exercise of 12_loss_spikes: what is special to its check (the reference, targeted hints, the
cases it protects, a hint naming no cause) and the case generator: the reference rule names the cause each case
was built with. The contract (solution passes, stub fails, hints, every typical wrong answer of
tests/support/wrong_answers/nb12.py fails) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb12_loss_spikes import CAUSES, check_cases, check_diagnose, reference_cause
from tests.support.notebook_cells import exercise_pairs, run_source, stub_hints
from tests.support.wrong_answers.nb12 import WRONG

NAME = "12_loss_spikes.ipynb"


def _solution():
    return run_source(exercise_pairs(NAME)[0][0])["diagnose_spike"]


def test_solution_agrees_with_the_reference():
    fn = _solution()
    for case in check_cases():
        assert fn(case["records"]) == reference_cause(case["records"]) == case["cause"], case["name"]


def test_stub_hint_names_no_cause():
    # its lines of the answer: tests/test_exercise_contracts.py
    (hint,) = stub_hints(exercise_pairs(NAME)[0][1])
    assert not any(f"'{c}'" in hint or f'"{c}"' in hint for c in CAUSES)


def test_targeted_hints():
    with pytest.raises(CheckFailed) as info:
        check_diagnose(run_source(WRONG["grad-norm spike means lr"])["diagnose_spike"])
    assert "batch 统计量" in info.value.hint
    with pytest.raises(CheckFailed) as info:
        check_diagnose(run_source(WRONG["Chinese labels"])["diagnose_spike"])
    assert "'data'" in info.value.expected


def test_designed_cases_have_the_causes_they_were_built_with():
    for seed in [1234, *range(1, 51)]:
        cases = check_cases(seed)
        assert {c["cause"] for c in cases} == set(CAUSES)
        for case in cases:
            assert reference_cause(case["records"]) == case["cause"], (seed, case["name"])


def test_check_does_not_let_the_learner_edit_the_cases():
    def vandal(records):
        records.clear()
        return "data"
    with pytest.raises(CheckFailed):
        check_diagnose(vandal)
    assert check_cases()[0]["records"]
