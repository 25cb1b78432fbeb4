"""07's batch-dependency check (exercise 3) and its helper ``course_utils.debug.batch_mixing``.

Each wrong answer is a mistake a learner plausibly makes (its comment says which, and the
fragment is what the failure message must name); the check must fail on every one with its
default seed and, in the slow sweep, with 50 other seeds.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_tools.checks import CheckFailed
from course_tools.checks import nb07_single_batch_overfit as checks
from course_utils.debug import batch_mixing
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import SWEEP_SEEDS, failure_twice


@pytest.fixture(scope="module")
def pair():
    """(solution, stub) of exercise 3."""
    return exercise_pairs("07_single_batch_overfit.ipynb")[2]


_SOURCE = '''
import torch

def batch_mixing(model, x, i=0):
{body}
'''

_RIGHT = '''
    was = model.training
    model.eval()
    leaf = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(leaf)[i].sum(), leaf)
    model.train(was)
    return {j for j in range(len(x)) if j != i and bool(grad[j].ne(0).any())}'''


def _mutant(*edits: tuple[str, str]) -> str:
    """The right answer with the learner's mistake: each (old, new) replaced once."""
    body = _RIGHT
    for old, new in edits:
        assert old in body, old
        body = body.replace(old, new, 1)
    return body


_NO_MODE = (("    was = model.training\n    model.eval()\n", ""), ("    model.train(was)\n", ""))

# name -> (body of batch_mixing, a fragment the failure message must contain)
WRONG = {
    # differentiates the whole batch's output: every sample "mixes" in any model
    "whole batch": (_mutant(("model(leaf)[i].sum()", "model(leaf).sum()")), "互不相连"),
    # forgets to leave i out
    "includes i": (_mutant(("if j != i and ", "if ")), "互不相连"),
    # tests whether a gradient row exists instead of whether it is zero
    "is not None": (_mutant(("bool(grad[j].ne(0).any())", "grad[j] is not None")), "互不相连"),
    # never switches to eval mode: training-mode BatchNorm mixes by design
    "no eval": (_mutant(*_NO_MODE), "BatchNorm"),
    # switches to eval mode and leaves the model there
    "stays in eval": (_mutant(("    model.train(was)\n", "")), "training=True"),
    # switches back to training mode whatever the mode was
    "always train()": (_mutant(("model.train(was)", "model.train()")), "training=False"),
    # a tolerance: the faint leak (gradients far below 1e-3) is missed
    "tolerance": (_mutant(("bool(grad[j].ne(0).any())", "grad[j].abs().max().item() > 1e-3")), "极弱"),
    # marks the caller's tensor as requiring gradients
    "caller's x": (_mutant(("x.detach().clone().requires_grad_(True)", "x.requires_grad_(True)")), "调用者的 x"),
    # backward() fills the parameters' .grad, which the learner's next optimizer step would add up
    "backward leaves .grad": (_mutant(("(grad,) = torch.autograd.grad(model(leaf)[i].sum(), leaf)",
                                       "model(leaf)[i].sum().backward()\n    grad = leaf.grad")), ".grad"),
    # an answer that claims no model ever mixes
    "empty set": ('''
    return set()''', "两个样本混在一起"),
    # a list instead of a set
    "list": (_mutant(("return {j", "return [j"), ("any())}", "any())]")), "set"),
    # forgets requires_grad: autograd.grad raises, and the check reports it
    "no requires_grad": (_mutant((".requires_grad_(True)", "")), "RuntimeError"),
}

# accepted variants: backward on the copy with the parameters' .grad put back; a per-row sum of |grad|
ACCEPTED = {
    "backward, grads cleared": '''
    was = model.training
    model.eval()
    leaf = x.detach().clone().requires_grad_(True)
    model(leaf)[i].sum().backward()
    model.zero_grad(set_to_none=True)
    model.train(was)
    return {j for j in range(len(x)) if j != i and leaf.grad[j].abs().sum().item() > 0}''',
    "count_nonzero": '''
    training = model.training
    try:
        model.eval()
        copy = x.clone().detach().requires_grad_()
        grad = torch.autograd.grad(model(copy)[i].sum(), copy)[0]
    finally:
        model.train(training)
    return {int(j) for j in range(x.shape[0]) if j != i and torch.count_nonzero(grad[j]) > 0}''',
}


def _fn(body: str):
    return run_source(_SOURCE.format(body=body))["batch_mixing"]


def test_check_passes_on_the_solution_and_accepted_variants(pair, capsys):
    checks.check_batch_mixing(run_source(pair[0])["batch_mixing"])
    for body in ACCEPTED.values():
        checks.check_batch_mixing(_fn(body))
    assert capsys.readouterr().out.count("✅") == 1 + len(ACCEPTED)


def test_check_fails_on_the_stub(pair):
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        checks.check_batch_mixing(run_source(pair[1])["batch_mixing"])


@pytest.mark.parametrize("name", list(WRONG))
def test_check_rejects_typical_mistakes(name):
    message = failure_twice(checks.check_batch_mixing, _fn(WRONG[name][0]))
    assert WRONG[name][1] in message, message


def test_the_helper_finds_what_each_case_is_built_to_show():
    # the check's expected answers come from course_utils.debug.batch_mixing: hold it to the constructions
    x = torch.randn(10, 16, generator=torch.Generator().manual_seed(0))
    for case, mode, _ in checks.MIXING_CASES:
        model = checks.mixing_model(case, 0).train(mode == "train")
        expected = {"clean": set(), "batchnorm": set(), "pairs": {4 ^ 1}, "faint": set(range(10)) - {4}}[case]
        assert batch_mixing(model, x, 4) == expected, case
        assert model.training == (mode == "train")
        assert all(p.grad is None for p in model.parameters()) and not x.requires_grad


def test_the_helper_sees_a_wrong_view_and_training_mode_batchnorm():
    # 07 §0.3's two demonstrations, at unit size: a view that mixes the batch, and BatchNorm by mode
    torch.manual_seed(0)
    lin = nn.Linear(4, 6)
    x = torch.randn(5, 4)

    class WrongView(nn.Module):
        def forward(self, inp):
            return lin(inp).view(-1, len(inp)).t()

    assert batch_mixing(WrongView(), x, 2) == {0, 1, 3, 4}
    bn = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).train()
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(bn(leaf)[2].sum(), leaf)
    assert grad[0].ne(0).any()                     # training mode mixes ...
    assert batch_mixing(bn, x, 2) == set() and bn.training   # ... the check looks in eval mode, then restores


def test_stub_hint_contains_no_line_of_the_answer(pair):
    assert not answer_lines_in("".join(stub_hints(pair[1])), pair[0])


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed(pair):
    solution = run_source(pair[0])["batch_mixing"]
    wrong = {name: _fn(body) for name, (body, _) in WRONG.items()}
    accepted = [_fn(body) for body in ACCEPTED.values()]
    for seed in SWEEP_SEEDS:
        for fn in (solution, *accepted):
            checks.check_batch_mixing(fn, seed=seed)
        for name, fn in wrong.items():
            with pytest.raises(CheckFailed):
                checks.check_batch_mixing(fn, seed=seed)
