"""The check of notebook 03 passes on the solution and fails on the stub and typical wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_tools.checks.nb03_ema import check_ema_update
from tests.notebook_cells import exercise_pairs, run_source

NAME = "03_ema.ipynb"


@pytest.fixture(scope="module")
def cells():
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 1
    return pairs


def test_ema_solution_passes_stub_fails(cells, capsys):
    solved, stub = cells[0]
    check_ema_update(run_source(solved)["ema_update_"])
    assert "✅" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="练习尚未完成"):
        check_ema_update(run_source(stub)["ema_update_"])


@torch.no_grad()
def _swapped(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.copy_(p) if num_updates == 0 else e.mul_(1 - decay).add_(p, alpha=decay)
    for e, b in zip(ema_model.buffers(), model.buffers()):
        e.copy_(b)


@torch.no_grad()
def _no_first_copy(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.mul_(decay).add_(p, alpha=1 - decay)
    for e, b in zip(ema_model.buffers(), model.buffers()):
        e.copy_(b)


@torch.no_grad()
def _params_only(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - decay)


@torch.no_grad()
def _copy_always(ema_model, model, decay, num_updates):
    ema_model.load_state_dict(model.state_dict())


def _no_grad_missing(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)  # in-place on a leaf that requires grad: raises


@pytest.mark.parametrize("wrong, message", [
    (_swapped, "对调"), (_no_first_copy, "直接复制"), (_params_only, "缓冲区"), (_copy_always, "decay"),
    (_no_grad_missing, "RuntimeError"),
])
def test_ema_rejects_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ema_update(wrong)
