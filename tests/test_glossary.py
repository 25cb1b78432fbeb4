"""One term per concept: the forbidden variants of GLOSSARY.md appear nowhere a learner reads."""
from __future__ import annotations

import nbformat
import pytest

from tests.support.texts import ROOT, glossary, learner_texts, squash


def test_glossary_is_a_well_formed_table():
    rows = glossary()
    assert len(rows) >= 20
    terms = [r["term"] for r in rows]
    assert len(set(terms)) == len(terms), "a term is listed twice"
    for row in rows:
        assert row["english"], row
        for variant in row["forbidden"]:
            assert squash(variant) not in squash(row["term"]), f"{row['term']}: forbids its own term"
    warmups = [r["term"] for r in rows if "warm-up" in str(r["english"])]
    assert len(warmups) == 3, f"three different warm-ups need three names: {warmups}"


def test_glossary_is_linked_from_readme_and_the_first_notebook():
    assert "GLOSSARY.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    first = nbformat.read(ROOT / "solutions" / "00_start_here.ipynb", as_version=4)
    assert any("GLOSSARY.md" in c.source for c in first.cells if c.cell_type == "markdown")


@pytest.fixture(scope="module")
def squashed_texts() -> dict[str, str]:
    """``learner_texts()`` without whitespace, read once for every row."""
    return {where: squash(text) for where, text in learner_texts().items()}


@pytest.mark.parametrize("row", [r for r in glossary() if r["forbidden"]], ids=lambda r: str(r["english"]))
def test_forbidden_variants_are_not_used(row, squashed_texts):
    found = [(where, variant) for where, text in squashed_texts.items() for variant in row["forbidden"]
             if squash(variant) in text]
    assert not found, f"use “{row['term']}” instead of: {found[:8]}"
