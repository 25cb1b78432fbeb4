"""Notebook 03 (EMA): what is special to it. The contract of its check (solution passes, stub fails, hints,
every typical wrong answer of tests/support/wrong_answers/nb03.py fails with its fragment, demo cells)
is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

NAME = "03_ema.ipynb"


def test_one_statistics_rule():
    """The raw-vs-EMA verdicts come from course_utils.stats (paired t-interval), not from ± 2 standard errors."""
    import nbformat

    from tests.support.notebook_cells import ROOT
    nb = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "paired_comparison(" in code and "2 * se" not in code
    assert "均值 ± 2 个标准误的区间" not in prose and "t 置信区间" in prose
