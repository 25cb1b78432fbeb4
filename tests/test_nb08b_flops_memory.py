"""The exercise checks of 08b_flops_memory: what is special to them (right answers by hand, the accepted ways of
counting, no number of a hint passes) and the stored run's line widths. The contract (solution passes, stub
fails, hints, every typical wrong answer of tests/support/wrong_answers/nb08b.py fails naming its mistake, the slow
sweeps) is in tests/test_exercise_contracts.py.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from course_tools import release
from course_tools.progress import width
from course_tools.checks import CheckFailed
from course_tools.checks.nb08b_flops_memory import check_peak_memory, check_step_flops
from tests.support.notebook_cells import exercise_pairs, stub_hints
from tests.support.sweep import SWEEP_SEEDS
from tests.support.wrong_answers.nb08b import _budget, _right, _side

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
                if width(line) > release.WIDTH and not line.startswith("数据: ")]
    assert not too_wide, too_wide


# --- the FLOP-count exercise (§5) -------------------------------------------------------------


def test_counting_the_bias_adds_is_accepted():
    # FlopCounterMode ignores biases; counting their adds (forward, and the bias gradient's sum) is no mistake
    bias = lambda b, s: b * 8 * s * s + b * 16 * _side(s) ** 2 + b * 10
    check_step_flops(lambda b, s: _right(b, s) + bias(b, s))
    check_step_flops(lambda b, s: _right(b, s) + 2 * bias(b, s))


# --- the memory exercise (§6) -----------------------------------------------------------------


def _exercise(index: int):
    """Exercise ``index`` of 08b's §5 (0) and §6 (1): its check, the function's name, a right answer of this file."""
    return {0: (check_step_flops, "step_flops", _right), 1: (check_peak_memory, "peak_memory_bytes", _budget)}[index]


@pytest.mark.parametrize("index", [0, 1])
def test_accounting_check_passes_on_the_reference(index, capsys):
    # and on the solution: tests/test_exercise_contracts.py
    check, _, reference = _exercise(index)
    check(reference)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("index", [0, 1])
def test_accounting_stub_hint_gives_no_number_that_passes(index):
    # no line of the answer either: tests/test_exercise_contracts.py
    check, _, _ = _exercise(index)
    _, stub = _pairs(index)
    (hint,) = stub_hints(stub)
    for number in re.findall(r"\d+(?:\.\d+)?", hint):
        with pytest.raises(CheckFailed):
            check(lambda *args, v=float(number): v)


def test_counting_the_input_logits_and_biases_either_way_is_accepted():
    # the input batch and the logits are in memory too; leaving out the biases is a rounding
    check_peak_memory(lambda w, b: _budget(w, b) + 4 * b * (w[0] + w[-1]))
    check_peak_memory(lambda w, b: _budget(w, b) - 16 * sum(w[1:]))


@pytest.mark.slow
def test_memory_accepted_verdict_does_not_depend_on_the_seed():
    # the solution and the wrong answers with the same seeds: tests/test_exercise_sweeps.py
    inputs_and_logits = lambda w, b: _budget(w, b) + 4 * b * (w[0] + w[-1])   # also right
    for seed in SWEEP_SEEDS:
        check_peak_memory(inputs_and_logits, seed=seed)
