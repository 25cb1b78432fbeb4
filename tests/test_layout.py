"""The package layout: learner helpers (course_utils) never depend on the course machinery (course_tools)."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import course_tools
import course_utils
from course_tools.checks import nb10_homework

ROOT = Path(__file__).resolve().parent.parent


def _modules(package) -> list[str]:
    found = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        found.append(info.name)
    return found


def _imported_names(path: Path, package: str) -> set[str]:
    """Every module named by an import statement of ``path`` (a module of ``package``); relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
    return names


def test_course_utils_imports_nothing_from_course_tools():
    """The import graph, statically (every import statement, also inside functions)."""
    offenders = {}
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        bad = sorted(n for n in _imported_names(path, package) if n.split(".")[0] == "course_tools")
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_importing_every_course_utils_module_loads_no_course_tools():
    """The import graph, dynamically: a fresh interpreter imports all of course_utils."""
    modules = _modules(course_utils)
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'course_tools'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_static_check_would_catch_an_upward_import(tmp_path):
    """The static check is not vacuous: it sees function-local and relative imports too."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\ndef f():\n    from course_tools.checks import expect\n"
                     "from ..course_tools import quiet\n", encoding="utf-8")
    names = _imported_names(probe, "pkg.sub")
    assert {"os", "course_tools.checks", "pkg.course_tools"} <= names
    assert "course_tools.quiet" in _imported_names(ROOT / "course_tools" / "release.py", "course_tools")


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) + _modules(course_tools)
                                  if not m.rsplit(".", 1)[-1].startswith("_") and "." in m])
def test_public_modules_declare_all(name):
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) if "." in m])
def test_each_helper_says_where_it_is_taught(name):
    doc = importlib.import_module(name).__doc__ or ""
    assert "Taught in ``" in doc, f"{name}: the module docstring must name the notebook that teaches it"
    for notebook in {w.strip("`") for w in doc.split() if w.startswith("``") and w[2:4].isdigit()}:
        assert list((ROOT / "solutions").glob(notebook.split("``")[0] + "*.ipynb")), (name, notebook)


# What starts a process in a notebook's code: a subprocess, DataLoader workers, a multiprocessing context,
# torchrun, or a homework check (each runs the learner's scripts).
_STARTS_PROCESSES = re.compile(r"\bsubprocess\b|num_workers=(?!0\b)|multiprocessing|torchrun|^(?:"
                               + "|".join(u.check.__name__ for u in nb10_homework.UPGRADES) + r")\(", re.MULTILINE)


def test_slow_notebooks_exist_and_are_left_out_of_the_quick_loop(request):
    """A renamed notebook must not silently rejoin `pytest -m "not slow"` (conftest.SLOW_NOTEBOOKS), and
    every notebook whose code starts processes is in that list (the rule of CONTRIBUTING.md).

    The collection checked is this session's own when it holds the solution notebooks (the README's
    `pytest`: their items carry the slow mark; the quick loop: none of them is left), else a
    `--collect-only -m "not slow"` in a subprocess.
    """
    import conftest
    assert conftest.SLOW_NOTEBOOKS and all((ROOT / "solutions" / name).is_file() for name in conftest.SLOW_NOTEBOOKS)
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        found = _STARTS_PROCESSES.search(code)
        assert not found or path.name in conftest.SLOW_NOTEBOOKS, f"{path.name} starts processes ({found[0]!r})"
    notebooks = [item for item in request.session.items
                 if Path(str(item.fspath)).parent == ROOT / "solutions" and str(item.fspath).endswith(".ipynb")]
    markexpr = request.config.getoption("markexpr")
    if notebooks and markexpr in ("", "not slow"):
        slow = [item for item in notebooks if Path(str(item.fspath)).name in conftest.SLOW_NOTEBOOKS]
        if markexpr == "not slow":
            assert not slow, f"left in the quick loop: {sorted({Path(str(i.fspath)).name for i in slow})}"
        else:
            assert slow and all(item.get_closest_marker("slow") for item in slow), "the slow notebooks lack the mark"
        return
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "not slow",
                          "solutions"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in out.stdout.splitlines() if "::" in line}
    assert collected and not collected & conftest.SLOW_NOTEBOOKS, out.stdout[-2000:]
