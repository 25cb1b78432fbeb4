"""Notebook 02 (gradient clipping, exercises 1 and 2): what is special to its checks. The contract (solution
passes, stub fails, hints, every typical wrong answer of tests/support/wrong_answers/nb02_grad_clipping.py fails with its
fragment, demo cells) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import pytest

from course_tools.checks.nb02_grad_clipping import HIDDEN_CANDIDATES
from tests.support.notebook_cells import exercise_pairs, run_source

NAME = "02_grad_clipping.ipynb"


@pytest.fixture(scope="module")
def cells():
    pairs = exercise_pairs(NAME)
    assert len(pairs) == 3  # exercise 3 (gradient accumulation): tests/test_nb02_accumulation.py
    return pairs[:2]


def test_hidden_candidates_labels_are_true(cells):
    """The hidden candidates' labels agree with the reference audit, so the check grades fairly."""
    audit = run_source(cells[1][0])["clipping_is_effective"]
    assert [audit(fn) for fn, *_ in HIDDEN_CANDIDATES] == [truth for _, truth, *_ in HIDDEN_CANDIDATES]
    assert sum(truth for _, truth, *_ in HIDDEN_CANDIDATES) == 3 and len(HIDDEN_CANDIDATES) == 8
