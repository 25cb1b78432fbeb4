"""02's gradient-accumulation check (exercise 3): the accepted variants pass (with its default seed and, slow
sweep, with 50 other seeds) and answers that are not a loss fail. The contract (solution passes, stub fails,
hints, every typical wrong answer of tests/support/wrong_answers/nb02_accumulation.py fails twice with its fragment,
demo cells) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb02_accumulation import check_accumulated_step
from tests.support.notebook_cells import exercise_pairs, run_source
from tests.support.sweep import SWEEP_SEEDS
from tests.support.wrong_answers.nb02_accumulation import _CLIP, _ZERO, mutant

NAME = "02_grad_clipping.ipynb"


@pytest.fixture(scope="module")
def pair():
    """(solution, stub) of exercise 3."""
    return exercise_pairs(NAME)[2]


# accepted variants: summed per-sample losses divided once by N; loss * n_i / N with a 0-dim tensor returned;
# model.zero_grad and course_utils' clip_gradients
ACCEPTED = {
    "sum then divide": (("F.cross_entropy(model(x), y) * (len(y) / total)",
                         'F.cross_entropy(model(x), y, reduction="sum") / total'),),
    "loss * n / N, tensor loss": (("(len(y) / total)", "len(y) / total"), ("window_loss = 0.0", "window_loss = torch.zeros(())"),
                                  ("window_loss += loss.item()", "window_loss = window_loss + loss.detach()")),
    "clip_gradients, model.zero_grad": ((_ZERO, "    model.zero_grad()\n"),
                                        (_CLIP, "    from course_utils.clipping import clip_gradients\n"
                                                "    clip_gradients(model.parameters(), max_norm)\n")),
}


def _fn(source: str):
    return run_source(source)["accumulated_step"]


def test_check_passes_on_the_accepted_variants(pair, capsys):
    for edits in ACCEPTED.values():
        check_accumulated_step(_fn(mutant(pair[0], *edits)))
    assert capsys.readouterr().out.count("✅") == len(ACCEPTED)


def test_check_rejects_answers_that_are_not_a_loss(pair):
    for bad in ("'0.5'", "[0.5]", "float('nan')"):
        source = mutant(pair[0], ("    return window_loss\n", f"    return {bad}\n"))
        with pytest.raises(CheckFailed, match="期望"):
            check_accumulated_step(_fn(source))


@pytest.mark.slow
def test_accepted_verdicts_do_not_depend_on_the_seed(pair, workbook_threads):
    accepted = [_fn(mutant(pair[0], *edits)) for edits in ACCEPTED.values()]
    for seed in SWEEP_SEEDS:
        for fn in accepted:
            check_accumulated_step(fn, seed=seed)
