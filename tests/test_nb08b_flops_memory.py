"""The exercise checks of 08b_flops_memory: pass on the solution, fail on the stub and on typical mistakes.

Each wrong answer is a mistake a learner plausibly makes (the comment says which); the check must
fail on every one with its default seed, and (slow sweep) with 50 other seeds too.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from course_tools import release
from course_tools.checks import CheckFailed
from course_tools.checks.nb08b_flops_memory import check_peak_memory, check_step_flops
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS, fails_naming, sweep_verdicts

NAME = "08b_flops_memory.ipynb"


def _pairs(index: int):
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 2, f"期望 2 个练习;实际 {len(pairs)}"
    return pairs[index]


def test_every_printed_line_of_the_stored_run_fits_in_jupyterlab():
    # JupyterLab wraps a longer line, and a wrapped table loses its columns (the profiler table of §2 was 124
    # wide). The learner copy has no outputs: the solution's stored run is what a learner's run prints.
    # load_cifar10's data-source note is exempt: its length depends on the data folder's path, and it is prose.
    nb = nbformat.read(release.SOLUTIONS / NAME, as_version=4)
    lines = [(index, line) for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for out in cell.outputs if out.output_type == "stream" for line in out.text.splitlines()]
    assert any(line.startswith("aten::") for _, line in lines)   # the profiler table of §2 is there
    too_wide = [f"#{index}: {line}" for index, line in lines
                if release.width(line) > release.WIDTH and not line.startswith("数据: ")]
    assert not too_wide, too_wide


# --- the FLOP-count exercise (§5) -------------------------------------------------------------


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


# --- the memory exercise (§6) -----------------------------------------------------------------


def _params(widths):
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def _acts(widths, b):
    """Bytes of the saved activations: each hidden layer's ReLU output, fp32."""
    return 4 * b * sum(widths[1:-1])


def _budget(widths, b):
    return 16 * _params(widths) + _acts(widths, b)


def _exercise(index: int):
    """Exercise ``index`` of 08b's §5 (0) and §6 (1): its check, the function's name, a right answer of this file."""
    return {0: (check_step_flops, "step_flops", _right), 1: (check_peak_memory, "peak_memory_bytes", _budget)}[index]


@pytest.mark.parametrize("index", [0, 1])
def test_accounting_check_passes_on_solution_and_reference(index, capsys):
    check, name, reference = _exercise(index)
    solution, _ = _pairs(index)
    check(run_source(solution)[name])
    assert "✅" in capsys.readouterr().out
    check(reference)


@pytest.mark.parametrize("index", [0, 1])
def test_accounting_check_fails_on_released_stub(index):
    check, name, _ = _exercise(index)
    _, stub = _pairs(index)
    assert "raise NotImplementedError" in stub and "### BEGIN SOLUTION" not in stub
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check(run_source(stub)[name])


@pytest.mark.parametrize("index", [0, 1])
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


# the two exercises' checks and their typical wrong answers: §5 FLOPs, §6 memory
_WRONG = {"flops": (check_step_flops, FLOP_WRONG_ANSWERS), "memory": (check_peak_memory, MEMORY_WRONG_ANSWERS)}


@pytest.mark.parametrize("exercise, name", [(e, n) for e, (_, answers) in _WRONG.items() for n in sorted(answers)])
def test_check_fails_on_typical_wrong_answers(exercise, name):
    check, answers = _WRONG[exercise]
    fails_naming(check, *answers[name])


@pytest.mark.slow
def test_flop_verdicts_do_not_depend_on_the_seed():
    sweep_verdicts(check_step_flops, run_source(_pairs(0)[0])["step_flops"], FLOP_WRONG_ANSWERS)


@pytest.mark.slow
def test_memory_verdicts_do_not_depend_on_the_seed():
    solution = run_source(_pairs(1)[0])["peak_memory_bytes"]
    inputs_and_logits = lambda w, b: _budget(w, b) + 4 * b * (w[0] + w[-1])   # also right
    for seed in SWEEP_SEEDS:
        check_peak_memory(inputs_and_logits, seed=seed)
    sweep_verdicts(check_peak_memory, solution, MEMORY_WRONG_ANSWERS, seeds=SWEEP_SEEDS)
