"""The set_seed exercise of 05_reproducibility: what is special to its check (it restores the CUDA seeding
function and the learner's generator) and the notebook's statistics rule. The contract (solution passes, stub
fails, hints, every typical wrong answer of tests/support/wrong_answers/nb05.py fails with its fragment)
is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""

import pytest

from course_tools.checks import CheckFailed
from course_tools.checks.nb05_reproducibility import check_set_seed
from tests.support.notebook_cells import run_source
from tests.support.wrong_answers.nb05 import WRONG

NAME = "05_reproducibility.ipynb"


def test_check_restores_cuda_seeding_function_and_the_learners_rng():
    import random

    import torch
    original = torch.cuda.manual_seed_all
    random.seed(5)
    expected = random.random()
    random.seed(5)
    with pytest.raises(CheckFailed):
        check_set_seed(run_source(WRONG["missing numpy"][0])["set_seed"])
    assert torch.cuda.manual_seed_all is original
    assert random.random() == expected


def test_one_statistics_rule():
    """Verdicts over seeds come from course_utils.stats (paired t-interval), not from max - min (issue 20)."""
    import nbformat

    from tests.support.notebook_cells import ROOT
    nb = nbformat.read(ROOT / "solutions" / "05_reproducibility.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "不能说 0.033 更好" not in text and "效应 > 种子间波动" not in text
    verdicts = [c for c in nb.cells if c.cell_type == "code" and "paired_comparison(" in c.source]
    assert len(verdicts) == 1 and "claim(" in verdicts[0].source
    assert "为什么配对" in text
