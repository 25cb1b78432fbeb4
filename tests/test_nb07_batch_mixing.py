"""07's batch-dependency check (exercise 3): its accepted variants, and its helper
``course_utils.debug.batch_mixing``. The contract (solution passes, stub fails, hints, every typical wrong
answer of tests/support/wrong_answers/nb07_batch_mixing.py fails twice with its fragment) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_tools.checks import nb07_single_batch_overfit as checks
from course_utils.debug import batch_mixing
from tests.support.notebook_cells import run_source
from tests.support.sweep import SWEEP_SEEDS
from tests.support.wrong_answers.nb07_batch_mixing import _SOURCE


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


def test_check_passes_on_the_accepted_variants(capsys):
    for body in ACCEPTED.values():
        checks.check_batch_mixing(_fn(body))
    assert capsys.readouterr().out.count("✅") == len(ACCEPTED)


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


@pytest.mark.slow
def test_accepted_verdicts_do_not_depend_on_the_seed():
    accepted = [_fn(body) for body in ACCEPTED.values()]
    for seed in SWEEP_SEEDS:
        for fn in accepted:
            checks.check_batch_mixing(fn, seed=seed)
