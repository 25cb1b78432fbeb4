"""Read tagged cells from the notebooks, for the tests that prove each exercise check works.

Exercise cells are self-contained (their own imports) and define functions, so a test
can run the solution version, the released stub and a typical wrong answer side by side
and hand each to the notebook's check function.
"""
from __future__ import annotations

import hashlib
import linecache
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]

SECTION = re.compile(r"^##\s+(\d+)\.\s", flags=re.MULTILINE)
"""A numbered section's heading, ``## k. title``: what a pointer "NN §k" names (test_pointers, test_layout,
test_homework read sections through it; an unnumbered ``## 练习`` is no section)."""


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
    """Execute a cell's source in a fresh namespace and return it. Its text is kept in ``linecache``, as Jupyter
    keeps a cell's (13's check reads the learner's cell back from there)."""
    namespace: dict = {"__name__": "__exercise__"}
    filename = f"<exercise-{hashlib.sha1(source.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def stub_hints(stub: str) -> list[str]:
    """The messages of the ``raise NotImplementedError("...")`` lines of a released stub, in order."""
    import ast

    return [node.exc.args[0].value for node in ast.walk(ast.parse(stub))
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args
            and isinstance(node.exc.args[0], ast.Constant)]


def answer_lines_in(hints: str, solution: str, min_chars: int = 8) -> list[str]:
    """Lines of the solution's answer (between BEGIN and END SOLUTION) that ``hints`` gives away.

    Compared without spaces and comments; lines of ``min_chars`` characters or fewer are too
    common (``return x``) to count, unless ``min_chars`` is 0.
    """
    squeezed = hints.replace(" ", "")
    leaked = []
    for part in solution.split("### BEGIN SOLUTION")[1:]:
        for line in part.split("### END SOLUTION")[0].splitlines()[1:]:
            code = line.split("#")[0].strip().replace(" ", "")
            if code and len(code) > min_chars and code in squeezed:
                leaked.append(line.strip())
    return leaked


def authored_code_lines(nb: nbformat.NotebookNode) -> int:
    """Lines of code a learner reads in ``nb``: without release's generated still-open cell, and a stub's
    hint wrapped over several string literals (``course_tools.release.raise_lines``) counted once."""
    continuation = re.compile(r"^\s+'.*'\)?$")
    return sum(sum(not continuation.match(line) for line in c.source.splitlines())
               for c in nb.cells if c.cell_type == "code" and c.get("id") != "still-open")
