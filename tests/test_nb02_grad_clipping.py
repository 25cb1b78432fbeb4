"""The checks of notebook 02 pass on the solutions and fail on stubs and typical wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_tools.checks.nb02_grad_clipping import HIDDEN_CANDIDATES, check_clip_audit, check_global_clip
from tests.notebook_cells import exercise_pairs, run_source

NAME = "02_grad_clipping.ipynb"


@pytest.fixture(scope="module")
def cells():
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 2
    return pairs


def test_global_clip_solution_passes_stub_fails(cells, capsys):
    solved, stub = cells[0]
    check_global_clip(run_source(solved)["my_clip_grad_norm_"])
    assert "✅" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_global_clip(run_source(stub)["my_clip_grad_norm_"])


def _per_parameter(parameters, max_norm):
    parameters = list(parameters)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
    for p in parameters:
        if p.grad is not None:
            torch.nn.utils.clip_grad_norm_([p], max_norm)
    return total


def _returns_post_clip(parameters, max_norm):
    parameters = list(parameters)
    torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))


def _always_rescales(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    for g in grads:
        g.mul_(max_norm / total)  # also scales UP gradients below the threshold
    return total


def _iterates_twice(parameters, max_norm):
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in parameters:  # empty when `parameters` is a generator
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


@pytest.mark.parametrize("wrong, message", [
    (_per_parameter, "逐个参数"), (_returns_post_clip, "裁剪后的范数"), (_always_rescales, "保持不变"),
    (_iterates_twice, "生成器"), (lambda parameters, max_norm: 1.0, "期望"),
])
def test_global_clip_rejects_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_global_clip(wrong)


def test_clip_audit_solution_passes_stub_fails(cells, capsys):
    solved, stub = cells[1]
    check_clip_audit(run_source(solved)["clipping_is_effective"])
    assert "✅" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_clip_audit(run_source(stub)["clipping_is_effective"])


def _audit_only_upper_bound(step_fn):
    # Typical wrong answer: "the update is not larger than max_norm" also accepts clipping the scaled grads.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    before = [p.detach().clone() for p in model.parameters()]
    step_fn(model, opt, scaler, torch.randn(16, 8) * 100, torch.randint(0, 4, (16,)), 1.0)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    return moved.item() <= 1.0 + 1e-3


def _audit_without_scaler(step_fn):
    # Typical wrong answer: a disabled scaler hides the "clip before unscale_" bug.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    before = [p.detach().clone() for p in model.parameters()]
    step_fn(model, opt, scaler, torch.randn(16, 8) * 100, torch.randint(0, 4, (16,)), 1.0)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    return abs(moved.item() - 1.0) <= 1e-3


@pytest.mark.parametrize("wrong", [lambda f: True, lambda f: False, _audit_only_upper_bound, _audit_without_scaler])
def test_clip_audit_rejects_wrong_answers(wrong):
    with pytest.raises(AssertionError, match="unscale_|候选"):
        check_clip_audit(wrong)


def test_hidden_candidates_labels_are_true(cells):
    """The hidden candidates' labels agree with the reference audit, so the check grades fairly."""
    audit = run_source(cells[0 + 1][0])["clipping_is_effective"]
    assert [audit(fn) for fn, _, _ in HIDDEN_CANDIDATES] == [truth for _, truth, _ in HIDDEN_CANDIDATES]
    assert {truth for _, truth, _ in HIDDEN_CANDIDATES} == {True, False}
