"""The checks of 07_single_batch_overfit pass on the solutions and fail on the stubs and on typical wrong answers.

Each wrong answer below is a mistake a learner plausibly makes (the comment says which); the
check must fail on every one with its default seed, and (slow sweep) with 50 other seeds too.
"""
from __future__ import annotations


import numpy as np
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks import nb07_single_batch_overfit as checks
from tests.notebook_cells import answer_lines_in, exercise_pairs, run_source, stub_hints
from tests.sweep import failure_twice

NAME = "07_single_batch_overfit.ipynb"


@pytest.fixture(scope="module")
def pairs():
    """(solution, stub) sources of each exercise; read when a test runs, so a broken notebook fails tests
    instead of breaking collection."""
    return exercise_pairs(NAME)


_LOOP = '''
import copy
import torch
import torch.nn.functional as F

def overfit_one_batch(model, x, y, steps=200, lr=3e-3):
{body}
'''

# name -> (body of overfit_one_batch, a fragment the failure message must contain)
WRONG_OVERFIT = {
    # forgets optimizer.step(): the loss never moves
    "no step": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
    return losses''', "第 2 步"),
    # a pretty curve and no training at all
    "fake curve": ('''
    return [2.3 * 0.9 ** i for i in range(steps)]''', "第 1 个 loss"),
    # forgets zero_grad: gradients accumulate over the steps (it still ends near 0 on this batch)
    "no zero_grad": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "zero_grad"),
    # records the loss after the update (evaluates again): the first entry is not the initial loss
    "loss recorded after the step": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append(F.cross_entropy(model(x), y).item())
    return losses''', "更新之前"),
    # plain SGD instead of Adam: far too slow at this learning rate
    "SGD instead of Adam": ('''
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "Adam"),
    # a learning rate copied from the notebook instead of the argument
    "ignores lr": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "lr"),
    # a new optimizer inside the loop: Adam's moments restart at every step
    "optimizer rebuilt every step": ('''
    losses = []
    for _ in range(steps):
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "只在循环外建一次"),
    # trains a copy "to keep the original safe": the caller's model never learns
    "trains a copy": ('''
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "就地"),
    # keeps the loss tensors (and the graph) instead of loss.item()
    "tensors instead of floats": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return losses''', "loss.item()"),
    # off by one: range(1, steps)
    "one step short": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(1, steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "长度为"),
}


_DIAGNOSE = '''
import math
import numpy as np

def diagnose(losses, grad_norms):
    losses, grad_norms = np.asarray(losses, dtype=float), np.asarray(grad_norms, dtype=float)
{body}
'''

# name -> body of diagnose
WRONG_DIAGNOSE = {
    # the example: thresholds on the final loss, read off the notebook's table (10 classes)
    "final-loss thresholds": '''
    final = losses[-1]
    if grad_norms.max() == 0:
        return "detached"
    if final < 0.1:
        return "healthy"
    if final < 2.0:
        return "wrong_loss"
    if final < 2.25:
        return "shuffled_labels"
    return "lr_too_small"''',
    # looks at the loss only: everything that does not reach 0 is "labels"
    "loss only": '''
    return "healthy" if losses[-1] < 0.1 else "shuffled_labels"''',
    # "still near ln(10)" as the test for a flat curve: only right for 10 classes
    "anchored to ln(10)": '''
    if losses[-1] < 0.1:
        return "healthy"
    if abs(losses[-1] - math.log(10)) < 0.2:
        return "detached" if grad_norms.max() == 0 else "lr_too_small"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "wrong_loss"''',
    # wrong_loss recognised by its floor at 10 classes, ln(e + 9) - 1 = 1.461
    "wrong_loss by its 10-class floor": '''
    if grad_norms.max() == 0:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    if abs(losses[-1] - 1.461) < 0.3:
        return "wrong_loss"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "lr_too_small"''',
    # a small final grad norm taken as "the chain is cut": a memorised batch has one too
    "small grad norm means detached": '''
    if grad_norms[-1] < 0.05:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # never looks at the grad norm: a flat line is always "learning rate"
    "ignores the grad norm": '''
    if losses[-1] < 0.1:
        return "healthy"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # measures the jitter over the whole curve: every fast initial descent looks "noisy"
    "jitter over the whole curve": '''
    if grad_norms.max() == 0:
        return "detached"
    if np.abs(np.diff(losses)).mean() > 0.005:
        return "shuffled_labels"
    if losses[-1] < 0.1:
        return "healthy"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # "loss barely fell" tested before "grad norm is zero": a detached run reads as a small lr
    "drop tested before the grad norm": '''
    if losses[-1] < 0.1:
        return "healthy"
    if (losses[0] - losses[-1]) / losses[0] < 0.1 and np.abs(np.diff(losses[-30:])).mean() < 0.005:
        return "lr_too_small"
    if grad_norms.max() == 0:
        return "detached"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "wrong_loss"''',
    # "the loss fell by less than half" taken as re-shuffled labels: they can fall further
    "shuffled as a small drop": '''
    if grad_norms.max() == 0:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    drop = (losses[0] - losses[-1]) / losses[0]
    if drop < 0.02:
        return "lr_too_small"
    if drop < 0.5 and losses[-1] > 2.0:
        return "shuffled_labels"
    return "wrong_loss"''',
    # a constant answer
    "constant": '''
    return "wrong_loss"''',
}


def _overfit(name):
    return run_source(_LOOP.format(body=WRONG_OVERFIT[name][0]))["overfit_one_batch"]


def _diagnose(name):
    return run_source(_DIAGNOSE.format(body=WRONG_DIAGNOSE[name]))["diagnose"]


def test_three_exercises(pairs):
    assert len(pairs) == 3


def test_overfit_check_passes_on_solution(pairs, capsys):
    checks.check_overfit_one_batch(run_source(pairs[0][0])["overfit_one_batch"])
    assert "✅" in capsys.readouterr().out


def test_overfit_check_fails_on_stub(pairs):
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        checks.check_overfit_one_batch(run_source(pairs[0][1])["overfit_one_batch"])


@pytest.mark.parametrize("name", list(WRONG_OVERFIT))
def test_overfit_check_rejects_typical_mistakes(name):
    with pytest.raises(CheckFailed, match=WRONG_OVERFIT[name][1]):
        checks.check_overfit_one_batch(_overfit(name))


def test_stubs_raise_not_implemented(pairs):
    import torch
    fn = run_source(pairs[0][1])["overfit_one_batch"]
    with pytest.raises(NotImplementedError):
        fn(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    with pytest.raises(NotImplementedError):
        run_source(pairs[1][1])["diagnose"]([1.0], [1.0])


def test_diagnose_check_passes_on_solution(pairs, capsys):
    checks.check_diagnose(run_source(pairs[1][0])["diagnose"])
    assert "✅" in capsys.readouterr().out


def test_diagnose_check_fails_on_stub(pairs):
    with pytest.raises(CheckFailed, match="练习尚未完成"):
        checks.check_diagnose(run_source(pairs[1][1])["diagnose"])


@pytest.mark.parametrize("name", list(WRONG_DIAGNOSE))
def test_diagnose_check_rejects_typical_mistakes(name):
    with pytest.raises(CheckFailed, match="诊断为|之一"):
        checks.check_diagnose(_diagnose(name))


def test_diagnose_cases_defeat_final_loss_thresholds():
    # Each bug's final losses span a range that holds another bug's final loss, so no interval
    # of the final loss (a pair of thresholds) picks out any one bug on these cases.
    curves = checks.diagnose_curves(1234)
    final = {bug: [float(np.mean(c.losses[-10:])) for c in curves if c.bug == bug] for bug in checks.BUGS}
    for bug in checks.BUGS[1:]:
        others = [v for b in checks.BUGS[1:] if b != bug for v in final[b]]
        assert any(min(final[bug]) < v < max(final[bug]) for v in others), (bug, final)


def test_diagnose_failure_names_the_features_and_the_class_count():
    with pytest.raises(CheckFailed) as info:
        checks.check_diagnose(_diagnose("final-loss thresholds"))
    assert "类" in info.value.hint and "grad norm" in info.value.hint


def test_checks_are_deterministic_and_leave_the_global_rng_alone(pairs):
    import torch
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    failure_twice(checks.check_diagnose, _diagnose("final-loss thresholds"))
    checks.check_overfit_one_batch(run_source(pairs[0][0])["overfit_one_batch"])
    assert torch.equal(torch.rand(3), expected)


def test_stub_hints_contain_no_line_of_the_answers(pairs):
    hints = "".join(h for _, stub in pairs for h in stub_hints(stub))
    for solution, _ in pairs:
        assert not answer_lines_in(hints, solution), answer_lines_in(hints, solution)


def test_mystery_functions_hide_three_distinct_bugs(pairs):
    import torch
    from course_utils.models import build_model
    fns = checks.mystery_functions(seed=3)
    assert sorted(fns) == ["mystery_a", "mystery_b", "mystery_c"]
    diagnose = run_source(pairs[1][0])["diagnose"]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    found = set()
    with checks._one_thread():
        for fn in fns.values():
            torch.manual_seed(0)
            found.add(diagnose(*fn(build_model("tiny", width=8), x, y, steps=100)))
    assert len(found) == 3 and "healthy" not in found


@pytest.mark.slow
def test_verdicts_do_not_depend_on_the_seed(pairs):
    solution_loop = run_source(pairs[0][0])["overfit_one_batch"]
    solution_diagnose = run_source(pairs[1][0])["diagnose"]
    wrong_loops = {name: _overfit(name) for name in WRONG_OVERFIT}
    wrong_diagnoses = {name: _diagnose(name) for name in WRONG_DIAGNOSE}
    for seed in range(1, 51):
        checks.check_overfit_one_batch(solution_loop, seed=seed)
        checks.check_diagnose(solution_diagnose, seed=seed)
        for name, fn in wrong_loops.items():
            with pytest.raises(CheckFailed):
                checks.check_overfit_one_batch(fn, seed=seed)
        for name, fn in wrong_diagnoses.items():
            with pytest.raises(CheckFailed):
                checks.check_diagnose(fn, seed=seed)
