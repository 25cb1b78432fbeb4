"""One term per concept: the forbidden variants of GLOSSARY.md appear nowhere a learner reads."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "GLOSSARY.md"


def glossary() -> list[dict[str, object]]:
    """Rows of the glossary table: term, English, forbidden variants (a list), note."""
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("术语", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append({"term": cells[0], "english": cells[1],
                     "forbidden": [v.strip() for v in cells[2].split("、") if v.strip()], "note": cells[3]})
    return rows


def _chinese_strings(path: Path) -> str:
    """The string literals of a Python file (where its learner-facing Chinese lives)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return "\n".join(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str))


def learner_texts() -> dict[str, str]:
    texts = {}
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for k, cell in enumerate(nb.cells):
            texts[f"{path.name} cell {k}"] = cell.source
    for folder in ("course_tools", "course_utils", "solutions/homework"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            texts[str(path.relative_to(ROOT))] = _chinese_strings(path)
    texts["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    return texts


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_glossary_is_a_well_formed_table():
    rows = glossary()
    assert len(rows) >= 20
    terms = [r["term"] for r in rows]
    assert len(set(terms)) == len(terms), "a term is listed twice"
    for row in rows:
        assert row["english"], row
        for variant in row["forbidden"]:
            assert _squash(variant) not in _squash(row["term"]), f"{row['term']}: forbids its own term"
    warmups = [r["term"] for r in rows if "warm-up" in str(r["english"])]
    assert len(warmups) == 3, f"three different warm-ups need three names: {warmups}"


def test_glossary_is_linked_from_readme_and_the_first_notebook():
    assert "GLOSSARY.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    first = nbformat.read(ROOT / "solutions" / "00_start_here.ipynb", as_version=4)
    assert any("GLOSSARY.md" in c.source for c in first.cells if c.cell_type == "markdown")


@pytest.fixture(scope="module")
def squashed_texts() -> dict[str, str]:
    """``learner_texts()`` without whitespace, read once for every row."""
    return {where: _squash(text) for where, text in learner_texts().items()}


@pytest.mark.parametrize("row", [r for r in glossary() if r["forbidden"]], ids=lambda r: str(r["english"]))
def test_forbidden_variants_are_not_used(row, squashed_texts):
    found = [(where, variant) for where, text in squashed_texts.items() for variant in row["forbidden"]
             if _squash(variant) in text]
    assert not found, f"use “{row['term']}” instead of: {found[:8]}"
