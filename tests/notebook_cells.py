"""Read tagged cells from the notebooks, for the tests that prove each exercise check works.

Exercise cells are self-contained (their own imports) and define functions, so a test
can run the solution version, the released stub and a typical wrong answer side by side
and hand each to the notebook's check function.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def tagged_sources(path: Path, tag: str) -> list[str]:
    """Sources of the code cells of ``path`` carrying ``tag``, in order."""
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code" and tag in c.get("metadata", {}).get("tags", [])]


def exercise_pairs(name: str) -> list[tuple[str, str]]:
    """``(solution source, released stub source)`` for each exercise cell of notebook ``name``."""
    solved = tagged_sources(ROOT / "solutions" / name, "exercise")
    stubs = tagged_sources(ROOT / "notebooks" / name, "exercise")
    assert len(solved) == len(stubs) > 0, f"{name}: {len(solved)} solved vs {len(stubs)} released exercise cells"
    return list(zip(solved, stubs))


def run_source(source: str) -> dict:
    """Execute a cell's source in a fresh namespace and return it."""
    namespace: dict = {"__name__": "__exercise__"}
    exec(compile(source, "<exercise>", "exec"), namespace)
    return namespace
