"""What a learner reads, gathered for the text tests: the glossary table, every notebook cell, the
Chinese string literals of the packages and the homework, the README."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
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


def chinese_strings(path: Path) -> str:
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
            texts[str(path.relative_to(ROOT))] = chinese_strings(path)
    texts["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    return texts


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)
