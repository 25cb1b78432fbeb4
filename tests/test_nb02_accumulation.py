"""02's gradient-accumulation check (exercise 3): it passes the solution and accepted variants, and fails the
released stub and every typical wrong answer, with its default seed and (slow sweep) with 50 other seeds.

Each wrong answer is the solution with one mistake edited in (its comment says which) and a fragment the
failure message must contain.
"""
from __future__ import annotations

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb02_accumulation import check_accumulated_step
from tests.exercise_isolation import demo_cells_using_exercises
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS, failure_twice

NAME = "02_grad_clipping.ipynb"


@pytest.fixture(scope="module")
def pair():
    """(solution, stub) of exercise 3."""
    return exercise_pairs(NAME)[2]


def _mutant(solution: str, *edits: tuple[str, str]) -> str:
    """The solution with the learner's mistake: each (old, new) replaced once."""
    for old, new in edits:
        assert old in solution, old
        solution = solution.replace(old, new, 1)
    return solution


_ZERO = "    optimizer.zero_grad(set_to_none=True)\n"
_CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
_STEP = "    optimizer.step()\n"
_BACKWARD = "        loss.backward()\n"

# name -> (edits to the solution, a fragment the failure message must contain)
WRONG = {
    # the mean of the micro-batches' means: uneven sizes are weighted wrongly
    "mean of means": ((("(len(y) / total)", "(1 / len(micro_batches))"),), "n_i / N"),
    # divides by the number of samples of the first micro-batch times K (the usual "loss / K" with N = K * n)
    "divided by K * first size": ((("(len(y) / total)", "(len(y) / (len(micro_batches) * len(micro_batches[0][1])))"),),
                                  "期望"),
    # the sum of the micro-batches' means: no weight at all
    "sum of means": ((("* (len(y) / total)", ""),), "直接相加"),
    # zero_grad inside the micro-batch loop: only the last micro-batch's gradient survives
    "zero_grad inside the loop": (((_ZERO, ""), ("        loss = F.", "        optimizer.zero_grad()\n        loss = F.")),
                                  "最后一个微批次"),
    # forgets zero_grad at the start: the stale gradients are added to the window's
    "no zero_grad (stale grads)": (((_ZERO, ""),), "zero_grad 一次"),
    # clips after every backward instead of once on the accumulated gradient
    "clip per micro-batch": (((_CLIP, ""), (_BACKWARD, _BACKWARD + "    " + _CLIP)), "每次 backward 之后"),
    # never clips
    "no clipping": (((_CLIP, ""),), "没有裁剪"),
    # steps once per micro-batch
    "step per micro-batch": (((_STEP, ""), (_BACKWARD, _BACKWARD + "    " + _STEP)), "只调用一次"),
    # forgets the step
    "no step": (((_STEP, ""),), "optimizer.step()"),
    # returns the last micro-batch's (unweighted) loss
    "returns the last loss": ((("    return window_loss\n",
                                "    return F.cross_entropy(model(x), y).item()\n"),), "多做了前向"),
    # returns the last micro-batch's weighted loss only (overwrites instead of adding)
    "returns last weighted loss": ((("window_loss += loss.item()", "window_loss = loss.item() / (len(y) / total)"),),
                                   "最后一个微批次的 loss"),
    # returns the mean of the micro-batches' mean losses
    "returns mean of means": ((("window_loss += loss.item()", "window_loss += loss.item() / (len(y) / total) / len(micro_batches)"),),
                              "各微批次 loss 的平均"),
    # clips before the last micro-batch's backward
    "clip before the last backward": (((_CLIP, ""), ("    for x, y in micro_batches:\n",
                                                     "    for i, (x, y) in enumerate(micro_batches):\n"),
                                       ("        loss.backward()\n",
                                                     "        if i == len(micro_batches) - 1:\n"
                                                     "            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
                                                     "        loss.backward()\n")), "期望"),
    # concatenates the micro-batches into one big batch: the memory accumulation is meant to save
    "one big batch": ((("    for x, y in micro_batches:\n        loss = F.cross_entropy(model(x), y) * (len(y) / total)\n",
                        "    for x, y in [(torch.cat([a for a, _ in micro_batches]), torch.cat([b for _, b in micro_batches]))]:\n"
                        "        loss = F.cross_entropy(model(x), y) * (len(y) / total)\n"),), "拼成一个大 batch"),
    # returns nothing
    "returns None": ((("    return window_loss\n", ""),), "None"),
}

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


def test_check_passes_on_the_solution_and_accepted_variants(pair, capsys):
    check_accumulated_step(_fn(pair[0]))
    for edits in ACCEPTED.values():
        check_accumulated_step(_fn(_mutant(pair[0], *edits)))
    assert capsys.readouterr().out.count("✅") == 1 + len(ACCEPTED)


def test_check_fails_on_the_stub(pair):
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_accumulated_step(_fn(pair[1]))


@pytest.mark.parametrize("name", list(WRONG))
def test_check_rejects_typical_mistakes(pair, name):
    edits, fragment = WRONG[name]
    message = failure_twice(check_accumulated_step, _fn(_mutant(pair[0], *edits)))
    assert fragment in message, message


def test_check_rejects_answers_that_are_not_a_loss(pair):
    for bad in ("'0.5'", "[0.5]", "float('nan')"):
        source = _mutant(pair[0], ("    return window_loss\n", f"    return {bad}\n"))
        with pytest.raises(CheckFailed, match="期望"):
            check_accumulated_step(_fn(source))


def test_stub_hint_contains_no_line_of_the_answer(pair):
    assert not answer_lines_in("".join(stub_hints(pair[1])), pair[0])


def test_demo_cells_never_call_the_exercise():
    assert not [c for c in demo_cells_using_exercises(NAME) if "accumulated_step" in c]


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed(pair, workbook_threads):
    solution = _fn(pair[0])
    accepted = [_fn(_mutant(pair[0], *edits)) for edits in ACCEPTED.values()]
    wrong = {name: _fn(_mutant(pair[0], *edits)) for name, (edits, _) in WRONG.items()}
    for seed in SWEEP_SEEDS:
        for fn in (solution, *accepted):
            check_accumulated_step(fn, seed=seed)
        for fn in wrong.values():
            with pytest.raises(CheckFailed):
                check_accumulated_step(fn, seed=seed)
