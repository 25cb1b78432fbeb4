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
from course_tools.checks.nb08_time_estimate import check_estimate_hours, check_peak_memory, check_step_flops
from course_utils.estimate import training_hours as reference_hours
from course_utils.estimate import estimate_training_time
from tests.notebook_cells import ROOT, answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS

NAME = "08_time_estimate.ipynb"


def _pairs(index: int = 0):
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 3, f"期望 3 个练习;实际 {len(pairs)}"
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


# --- the FLOP-count exercise (§8) -------------------------------------------------------------


def _side(s):
    return (s + 2 * 1 - 3) // 2 + 1


def _layers(b, s, side=None):
    """Forward FLOPs of the three layers, by hand (side: the second conv's output size)."""
    side = _side(s) if side is None else side
    return 2 * b * 8 * s * s * 27, 2 * b * 16 * side * side * 72, 2 * b * 16 * side * side * 10


def _right(b, s):
    c1, c2, fc = _layers(b, s)
    return 3 * (c1 + c2 + fc) - c1


def test_counting_the_bias_adds_is_accepted():
    # FlopCounterMode ignores biases; counting their adds (forward, and the bias gradient's sum) is no mistake
    bias = lambda b, s: b * 8 * s * s + b * 16 * _side(s) ** 2 + b * 10
    check_step_flops(lambda b, s: _right(b, s) + bias(b, s))
    check_step_flops(lambda b, s: _right(b, s) + 2 * bias(b, s))


FLOP_WRONG_ANSWERS = {
    # a multiply-add counted as one FLOP
    "mac_as_one_flop": (lambda b, s: _right(b, s) / 2, "2 个 FLOP"),
    # backward forgotten: forward only
    "forward_only": (lambda b, s: sum(_layers(b, s)), "只算了前向"),
    # backward counted as 1x forward
    "backward_as_forward": (lambda b, s: 2 * sum(_layers(b, s)), None),
    # the first layer's input gradient counted too (3x forward everywhere)
    "first_layer_input_grad": (lambda b, s: 3 * sum(_layers(b, s)), "第一层"),
    # the stride ignored: the second conv keeps the full size
    "stride_ignored": (lambda b, s: 3 * sum(_layers(b, s, side=s)) - _layers(b, s)[0], "stride"),
    # the padding ignored: H_out = (H - 3) // 2 + 1 in the second conv
    "padding_ignored": (lambda b, s: 3 * sum(_layers(b, s, side=(s - 3) // 2 + 1)) - _layers(b, s)[0], "padding"),
    # the stride's rounding: s / 2 instead of the floor formula (wrong on odd sizes)
    "half_side_unrounded": (lambda b, s: 3 * sum(_layers(b, s, side=s / 2)) - _layers(b, s)[0], "stride"),
    # the batch size forgotten
    "ignores_batch": (lambda b, s: _right(1, s), None),
    # parameters instead of FLOPs: the 6·N rule applied to a CNN
    "six_n_rule": (lambda b, s: 6 * b * (8 * 27 + 16 * 72 + 16 * _side(s) ** 2 * 10), None),
    # the optimizer update counted as one more forward
    "optimizer_as_forward": (lambda b, s: _right(b, s) + sum(_layers(b, s)), None),
    # the number returned as a string
    "returns_string": (lambda b, s: f"{_right(b, s):,}", "返回一个数"),
    # no return statement
    "returns_none": (lambda b, s: None, "返回一个数"),
}


# --- the memory exercise (§9) -----------------------------------------------------------------


def _params(widths):
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def _acts(widths, b):
    """Bytes of the saved activations: each hidden layer's ReLU output, fp32."""
    return 4 * b * sum(widths[1:-1])


def _budget(widths, b):
    return 16 * _params(widths) + _acts(widths, b)


def _exercise(index: int):
    """Exercise ``index`` of 08's §8 (1) and §9 (2): its check, the function's name, a right answer of this file."""
    return {1: (check_step_flops, "step_flops", _right), 2: (check_peak_memory, "peak_memory_bytes", _budget)}[index]


@pytest.mark.parametrize("index", [1, 2])
def test_accounting_check_passes_on_solution_and_reference(index, capsys):
    check, name, reference = _exercise(index)
    solution, _ = _pairs(index)
    check(run_source(solution)[name])
    assert "✅" in capsys.readouterr().out
    check(reference)


@pytest.mark.parametrize("index", [1, 2])
def test_accounting_check_fails_on_released_stub(index):
    check, name, _ = _exercise(index)
    _, stub = _pairs(index)
    assert "raise NotImplementedError" in stub and "### BEGIN SOLUTION" not in stub
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check(run_source(stub)[name])


@pytest.mark.parametrize("index", [1, 2])
def test_accounting_stub_hint_gives_no_line_of_the_answer_and_no_number_that_passes(index):
    check, _, _ = _exercise(index)
    solution, stub = _pairs(index)
    (hint,) = stub_hints(stub)
    assert not answer_lines_in(hint, solution, min_chars=0), answer_lines_in(hint, solution, min_chars=0)
    for number in re.findall(r"\d+(?:\.\d+)?", hint):
        with pytest.raises(CheckFailed):
            check(lambda *args, v=float(number): v)


def test_counting_the_input_logits_and_biases_either_way_is_accepted():
    # the input batch and the logits are in memory too; leaving out the biases is a rounding
    check_peak_memory(lambda w, b: _budget(w, b) + 4 * b * (w[0] + w[-1]))
    check_peak_memory(lambda w, b: _budget(w, b) - 16 * sum(w[1:]))


MEMORY_WRONG_ANSWERS = {
    # the optimizer states forgotten: weights + grads + activations
    "no_optimizer_states": (lambda w, b: 8 * _params(w) + _acts(w, b), "优化器状态"),
    # AdamW counted as one moment (like SGD with momentum)
    "adam_one_moment": (lambda w, b: 12 * _params(w) + _acts(w, b), "两个动量"),
    # the gradients forgotten
    "no_grads": (lambda w, b: 12 * _params(w) + _acts(w, b), "梯度"),
    # the activations forgotten: parameters only
    "no_activations": (lambda w, b: 16 * _params(w), "激活值"),
    # the activations per sample: the batch size forgotten
    "activations_without_batch": (lambda w, b: 16 * _params(w) + _acts(w, 1), "batch"),
    # each hidden layer counted twice (the Linear's output and the ReLU's output)
    "activations_twice": (lambda w, b: 16 * _params(w) + 2 * _acts(w, b), "只算一次"),
    # elements instead of bytes
    "elements_not_bytes": (lambda w, b: _budget(w, b) / 4, "元素个数"),
    # elements for the activations only (the states in bytes)
    "activation_elements": (lambda w, b: 16 * _params(w) + _acts(w, b) / 4, None),
    # MiB instead of bytes
    "returns_mib": (lambda w, b: _budget(w, b) / 2 ** 20, "MiB"),
    # fp16 bytes (2 per element) for everything
    "two_bytes_per_element": (lambda w, b: _budget(w, b) / 2, None),
    # the weights only
    "weights_only": (lambda w, b: 4 * _params(w), None),
    # formatted for printing, or no return statement
    "returns_string": (lambda w, b: f"{_budget(w, b) / 2 ** 20:.1f} MiB", "返回一个数"),
    "returns_none": (lambda w, b: None, "返回一个数"),
}


# the three exercises' checks and their typical wrong answers: §6 hours, §8 FLOPs, §9 memory
_WRONG = {"hours": (check_estimate_hours, WRONG_ANSWERS), "flops": (check_step_flops, FLOP_WRONG_ANSWERS),
          "memory": (check_peak_memory, MEMORY_WRONG_ANSWERS)}


@pytest.mark.parametrize("exercise, name", [(e, n) for e, (_, answers) in _WRONG.items() for n in sorted(answers)])
def test_check_fails_on_typical_wrong_answers(exercise, name):
    check, answers = _WRONG[exercise]
    fn, hint = answers[name]
    with pytest.raises(CheckFailed) as info:
        check(fn)
    assert str(info.value).startswith("期望"), str(info.value)
    if hint:
        assert hint in str(info.value), str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("exercise, index, name", [("hours", 0, "estimate_hours"), ("flops", 1, "step_flops")])
def test_verdicts_do_not_depend_on_the_seed(exercise, index, name):
    check, answers = _WRONG[exercise]
    solution = run_source(_pairs(index)[0])[name]
    for seed in range(1, 51):
        check(solution, seed=seed)
        for wrong, (fn, hint) in answers.items():
            with pytest.raises(CheckFailed) as info:
                check(fn, seed=seed)
            if hint:
                assert hint in str(info.value), (wrong, seed, str(info.value))


@pytest.mark.slow
def test_memory_verdicts_do_not_depend_on_the_seed():
    solution = run_source(_pairs(2)[0])["peak_memory_bytes"]
    for seed in SWEEP_SEEDS:
        check_peak_memory(solution, seed=seed)
        check_peak_memory(lambda w, b: _budget(w, b) + 4 * b * (w[0] + w[-1]), seed=seed)
        for name, (fn, hint) in MEMORY_WRONG_ANSWERS.items():
            with pytest.raises(CheckFailed) as info:
                check_peak_memory(fn, seed=seed)
            if hint:
                assert hint in str(info.value), (name, seed, str(info.value))
