"""09_self_test: every exercise check passes on the solution, fails on the stub and on typical wrong answers."""
from __future__ import annotations

import pytest

from course_tools.checks import nb09_quiz as checks
from course_tools.quiz import check
from tests.notebook_cells import exercise_pairs, run_source

NAME = "09_self_test.ipynb"


@pytest.fixture(scope="module")
def pairs():
    """(solution, stub) sources of each exercise; read when a test runs, so a broken notebook fails tests
    instead of breaking collection."""
    return exercise_pairs(NAME)
CHECKS = [("self_test_answers", checks.check_self_test_answers),
          ("estimate_hours", checks.check_estimate_hours),
          ("ema_start_weight", checks.check_ema_start_weight)]


def test_three_exercises(pairs):
    assert len(pairs) == len(CHECKS)


@pytest.mark.parametrize("k", range(len(CHECKS)))
def test_check_passes_on_solution(pairs, k, capsys):
    name, check_fn = CHECKS[k]
    check_fn(run_source(pairs[k][0])[name])
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("k", range(len(CHECKS)))
def test_check_fails_on_stub(pairs, k):
    name, check_fn = CHECKS[k]
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_fn(run_source(pairs[k][1])[name])


def _solution_answers(pairs):
    return run_source(pairs[0][0])["self_test_answers"]()


@pytest.mark.parametrize("qid, wrong", [("q3", "A"),        # "bf16 has more mantissa bits": it has fewer
                                        ("q4", "AC"),       # forgot update()
                                        ("q7", "ABE"),      # too many
                                        ("q10", 0.8),       # 1 - 200 * 0.001: the linear approximation
                                        ("q11", 4.2)])      # samples/s taken as steps/s
def test_answers_check_rejects_typical_mistakes(pairs, qid, wrong):
    answers = dict(_solution_answers(pairs), **{qid: wrong})
    with pytest.raises(AssertionError, match=f"答错 {qid}"):
        checks.check_self_test_answers(lambda: answers)


def test_answers_check_rejects_missing_and_non_dict(pairs):
    answers = _solution_answers(pairs)
    answers.pop("q5")
    with pytest.raises(AssertionError, match="未作答 q5"):
        checks.check_self_test_answers(lambda: answers)
    with pytest.raises(AssertionError, match="dict"):
        checks.check_self_test_answers(lambda: ["B"] * 11)


def test_solution_answers_match_the_bank(pairs):
    answers = _solution_answers(pairs)
    assert set(answers) == set(checks.GRADED_IDS)
    assert all(check(checks.QUIZ.by_id[q], a).correct for q, a in answers.items())


def test_estimate_check_rejects_unit_trap_and_constant():
    def ignores_unit(n, epochs, batch, rate, unit):
        return n * epochs / (batch * rate * 3600)      # treats samples/s as steps/s
    with pytest.raises(AssertionError, match="期望"):
        checks.check_estimate_hours(ignores_unit)
    with pytest.raises(AssertionError, match="期望"):
        checks.check_estimate_hours(lambda *a: 4.2)

    def minutes(n, epochs, batch, rate, unit):
        steps = rate if unit == "steps/s" else rate / batch
        return n * epochs / (batch * steps * 60)
    with pytest.raises(AssertionError):
        checks.check_estimate_hours(minutes)


def test_ema_check_rejects_linear_approximation_and_complement():
    with pytest.raises(AssertionError, match="期望"):
        checks.check_ema_start_weight(lambda d, n: max(0.0, 1 - n * (1 - d)))
    with pytest.raises(AssertionError, match="期望"):
        checks.check_ema_start_weight(lambda d, n: 1 - d ** n)   # the share of the new weights instead
