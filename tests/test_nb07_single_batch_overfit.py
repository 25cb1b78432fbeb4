"""The checks of 07_single_batch_overfit pass on the solutions and fail on stubs and typical wrong answers."""
import pytest

from course_tools.checks import nb07_single_batch_overfit as checks
from tests.notebook_cells import exercise_pairs, run_source

NAME = "07_single_batch_overfit.ipynb"


@pytest.fixture(scope="module")
def pairs():
    """(solution, stub) sources of each exercise; read when a test runs, so a broken notebook fails tests
    instead of breaking collection."""
    return exercise_pairs(NAME)

NO_STEP = '''
import torch
import torch.nn.functional as F

def overfit_one_batch(model, x, y, steps=200, lr=3e-3):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()          # forgot optimizer.step()
        losses.append(loss.item())
    return losses
'''

FAKE_CURVE = '''
def overfit_one_batch(model, x, y, steps=200, lr=3e-3):
    return [2.3 * 0.9 ** i for i in range(steps)]   # a pretty curve, no training
'''

LOSS_ONLY = '''
def diagnose(losses, grad_norms):
    return "healthy" if losses[-1] < 0.1 else "shuffled_labels"   # ignores the grad norm and the curve's shape
'''


def test_two_exercises(pairs):
    assert len(pairs) == 2


def test_overfit_check_passes_on_solution(pairs, capsys):
    checks.check_overfit_one_batch(run_source(pairs[0][0])["overfit_one_batch"])
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("source", ["stub", NO_STEP, FAKE_CURVE], ids=["stub", "no-step", "fake-curve"])
def test_overfit_check_rejects(pairs, source):
    source = pairs[0][1] if source == "stub" else source
    with pytest.raises(AssertionError):
        checks.check_overfit_one_batch(run_source(source)["overfit_one_batch"])


def test_stub_raises_not_implemented(pairs):
    import torch
    fn = run_source(pairs[0][1])["overfit_one_batch"]
    with pytest.raises(NotImplementedError):
        fn(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    with pytest.raises(NotImplementedError):
        run_source(pairs[1][1])["diagnose"]([1.0], [1.0])


def test_diagnose_check_passes_on_solution(pairs, capsys):
    checks.check_diagnose(run_source(pairs[1][0])["diagnose"])
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("source", ["stub", LOSS_ONLY, "def diagnose(l, g):\n    return 'detached'\n"],
                         ids=["stub", "loss-only", "constant"])
def test_diagnose_check_rejects(pairs, source):
    source = pairs[1][1] if source == "stub" else source
    with pytest.raises(AssertionError):
        checks.check_diagnose(run_source(source)["diagnose"])


def test_mystery_functions_hide_three_distinct_bugs(pairs):
    import torch
    from course_utils.models import build_model
    fns = checks.mystery_functions(seed=3)
    assert sorted(fns) == ["mystery_a", "mystery_b", "mystery_c"]
    diagnose = run_source(pairs[1][0])["diagnose"]
    x, y = checks._random_batch(0)
    found = set()
    for fn in fns.values():
        torch.manual_seed(0)
        found.add(diagnose(*fn(build_model("tiny", width=8), x, y, steps=100)))
    assert len(found) == 3 and "healthy" not in found
