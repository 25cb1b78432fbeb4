"""The check of notebook 03 passes on the solution and fails on the stub and typical wrong answers.

Each wrong answer is a mistake a learner plausibly makes, with a fragment its failure
message must contain. The check must fail on every one with its default seed and, in the
slow sweep, with 50 other seeds.
"""
from __future__ import annotations

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb03_ema import check_ema_update
from tests.exercise_isolation import demo_cells_using_exercises
from tests.notebook_cells import exercise_pairs, run_source
from tests.sweep import SWEEP_SEEDS

NAME = "03_ema.ipynb"

_BUFFERS = '''
        for e, b in zip(ema_model.buffers(), model.buffers()):
            e.copy_(b)
'''

# name -> (source of ema_update_, a fragment the failure message must contain)
WRONG = {
    # decay and 1 - decay swapped: the live weights get the large share
    "swapped decay": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.mul_(1 - decay).add_(p, alpha=decay)
''' + _BUFFERS, "对调"),
    # lerp's weight is the share of the END point: lerp_(p, decay) is the same swap
    "lerp weight = decay": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, decay)
''' + _BUFFERS, "对调"),
    # averages from the first call on: the shadow starts from the initial weights
    "no first copy": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.mul_(decay).add_(p, alpha=1 - decay)
''' + _BUFFERS, "直接复制"),
    # copies on the first call only when num_updates == 1 (off by one)
    "first copy at num_updates == 1": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 1 else e.mul_(decay).add_(p, alpha=1 - decay)
''' + _BUFFERS, "直接复制"),
    # forgets the buffers (BatchNorm statistics stay at their initial values)
    "parameters only": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - decay)
''', "buffers"),
    # averages the float buffers too (num_batches_tracked copied)
    "buffers averaged": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - decay)
        for e, b in zip(ema_model.buffers(), model.buffers()):
            e.copy_(b) if num_updates == 0 or not e.is_floating_point() else e.lerp_(b, 1 - decay)
''', "不做平均"),
    # copies everything every step: no averaging at all
    "copy always": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    ema_model.load_state_dict(model.state_dict())
''', "decay"),
    # rebinds the loop variable: nothing changes after the first copy
    "not in place": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            if num_updates == 0:
                e.copy_(p)
            else:
                e = decay * e + (1 - decay) * p
''' + _BUFFERS, "原地"),
    # in place on a parameter that requires grad, outside torch.no_grad()
    "no torch.no_grad()": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.copy_(p) if num_updates == 0 else e.mul_(decay).add_(p.detach(), alpha=1 - decay)
    for e, b in zip(ema_model.buffers(), model.buffers()):
        e.copy_(b)
''', "no_grad"),
    # adds an EMA warm-up that the exercise does not ask for
    "EMA warm-up": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    d = min(decay, (1 + num_updates) / (10 + num_updates))
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - d)
''' + _BUFFERS, "渐升"),
    # updates the live model towards the EMA instead
    "updates the wrong model": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            if num_updates == 0:
                e.copy_(p)
            else:
                p.lerp_(e, decay)
                e.copy_(p)
''' + _BUFFERS, "model 只读"),
}


@pytest.fixture(scope="module")
def cells():
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 1
    return pairs


def test_ema_solution_passes_stub_fails(cells, capsys):
    solved, stub = cells[0]
    check_ema_update(run_source(solved)["ema_update_"])
    assert "✅" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        check_ema_update(run_source(stub)["ema_update_"])


@pytest.mark.parametrize("name", sorted(WRONG))
def test_ema_rejects_wrong_answers(name):
    source, fragment = WRONG[name]
    with pytest.raises(CheckFailed) as info:
        check_ema_update(run_source(source)["ema_update_"])
    assert fragment in str(info.value), str(info.value)


def test_demo_cells_never_call_an_exercise():
    assert demo_cells_using_exercises(NAME) == []


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed(cells, workbook_threads):
    solution = run_source(cells[0][0])["ema_update_"]
    wrong = {name: run_source(source)["ema_update_"] for name, (source, _) in WRONG.items()}
    for seed in SWEEP_SEEDS:
        check_ema_update(solution, seed=seed)
        for name, fn in wrong.items():
            with pytest.raises(CheckFailed):
                check_ema_update(fn, seed=seed)


def test_one_statistics_rule():
    """The raw-vs-EMA verdicts come from course_utils.stats (paired t-interval), not from ± 2 standard errors."""
    import nbformat

    from tests.notebook_cells import ROOT
    nb = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "paired_comparison(" in code and "2 * se" not in code
    assert "均值 ± 2 个标准误的区间" not in prose and "t 置信区间" in prose
