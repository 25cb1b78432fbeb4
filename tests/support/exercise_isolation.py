"""Demo cells must not depend on exercise results (issue 13 item 5).

An unfinished exercise raises ``NotImplementedError`` and a wrong one returns wrong
values; a demo cell that called it would crash, or print a verdict that contradicts the
failed check right above it. Only ``check`` cells may use what an exercise defines.
"""
from __future__ import annotations

import ast

import nbformat

from tests.support.notebook_cells import ROOT


def _tags(cell: nbformat.NotebookNode) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def exercise_names(name: str) -> set[str]:
    """Top-level names that the exercise cells of ``solutions/<name>`` define."""
    nb = nbformat.read(ROOT / "solutions" / name, as_version=4)
    names: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and "exercise" in _tags(cell):
            for node in ast.parse(cell.source).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def demo_cells_using_exercises(name: str) -> list[str]:
    """``"cell <id>: <names>"`` for every code cell outside exercise/check cells that uses an exercise's name."""
    nb = nbformat.read(ROOT / "solutions" / name, as_version=4)
    defined = exercise_names(name)
    assert defined, f"{name}: no exercise defines a name"
    found = []
    for cell in nb.cells:
        tags = _tags(cell)
        if cell.cell_type != "code" or "exercise" in tags or "check" in tags:
            continue
        used = {n.id for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Name)} & defined
        if used:
            found.append(f"cell {cell.get('id')}: {sorted(used)}")
    return found
