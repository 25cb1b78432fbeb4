"""course_tools.checks.nb10_homework checks the homework by behaviour: they pass on the reference
solutions in solutions/homework/ and fail on the untouched baseline in notebooks/homework/."""
from pathlib import Path

import pytest

from course_tools.checks import nb10_homework as homework

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "homework"
BASELINE = ROOT / "notebooks" / "homework"
PRO = SOLUTION / "train_cifar_pro.py"

pytestmark = pytest.mark.slow


def test_reference_passes_config(capsys):
    homework.check_config(PRO)
    assert "✅" in capsys.readouterr().out


def test_reference_passes_clipping(capsys):
    homework.check_clipping(PRO)
    assert "✅" in capsys.readouterr().out


def test_reference_passes_resume(capsys):
    homework.check_resume(PRO)
    assert "✅" in capsys.readouterr().out


def test_reference_overfit_pair_passes(capsys):
    homework.check_overfit(SOLUTION / "debug_overfit.py", SOLUTION / "debug_overfit_broken_labels.py")
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("check", [homework.check_config, homework.check_clipping, homework.check_resume],
                         ids=["config", "clipping", "resume"])
def test_baseline_fails(check):
    with pytest.raises(AssertionError):
        check(BASELINE / "train_cifar.py")


def test_overfit_check_rejects_missing_and_swapped_scripts():
    with pytest.raises(AssertionError, match="找不到"):
        homework.check_overfit(BASELINE / "debug_overfit.py", BASELINE / "debug_overfit_broken_labels.py")
    # the healthy script handed in as the "broken" twin: it memorises the batch and exits 0
    with pytest.raises(AssertionError):
        homework.check_overfit(SOLUTION / "debug_overfit.py", SOLUTION / "debug_overfit.py")
