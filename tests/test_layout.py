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
                     "from ..course_tools import noninteractive\n", encoding="utf-8")
    names = _imported_names(probe, "pkg.sub")
    assert {"os", "course_tools.checks", "pkg.course_tools"} <= names
    assert "course_tools.noninteractive" in _imported_names(ROOT / "course_tools" / "release.py", "course_tools")


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) + _modules(course_tools)
                                  if not m.rsplit(".", 1)[-1].startswith("_") and "." in m])
def test_public_modules_declare_all(name):
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def _code_by_section(notebook: Path) -> dict[int, str]:
    """The code of each numbered section (``## k. ...``) of a notebook; 0: before the first heading."""
    found: dict[int, list[str]] = {}
    current: int | None = 0
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, flags=re.MULTILINE):
            m = re.search(r"^## (\d+)[.\s]", cell.source, flags=re.MULTILINE)
            current = int(m.group(1)) if m else None  # an unnumbered section (练习, 纪律) has no number to point at
        elif cell.cell_type == "code" and current is not None:
            found.setdefault(current, []).append(cell.source)
    return {k: "\n".join(v) for k, v in found.items()}


def _taught_in(doc: str) -> list[tuple[str, list[int]]]:
    """The pointers of a "Taught in ``NN_name`` §a–b (...), §c, ``MM_name`` ..." paragraph: (notebook, sections)."""
    paragraph = doc[doc.index("Taught in"):].split("\n\n")[0]
    while re.search(r"\([^()]*\)", paragraph):  # what a parenthesis says is not a pointer
        paragraph = re.sub(r"\([^()]*\)", "", paragraph)
    parts = re.split(r"``(\d\d\w*)``", paragraph)
    return [(notebook, [k for a, b in re.findall(r"§(\d+)(?:[–-](\d+))?", text) for k in range(int(a), int(b or a) + 1)])
            for notebook, text in zip(parts[1::2], parts[2::2])]


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) if "." in m])
def test_each_helper_says_where_it_is_taught_and_it_is_true(name):
    """d2l's rule: "Taught in NN §k" holds when a name of the module's ``__all__`` is used in a code cell of
    section k (each section a range names); "Taught in NN" alone, in some code cell of NN. A module no
    notebook uses says it is reference machinery and names the script that runs it."""
    module = importlib.import_module(name)
    doc = module.__doc__ or ""
    if "Taught in ``" not in doc:
        scripts = re.findall(r"``((?:solutions|course_tools)/[\w/.]+\.py)``", doc)
        assert "Reference machinery" in doc and scripts, f"{name}: say where it is taught, or whose machinery it is"
        assert all((ROOT / s).is_file() for s in scripts), (name, scripts)
        return
    pointers = _taught_in(doc)
    assert pointers, f"{name}: no ``NN_name`` after 'Taught in'"
    uses = re.compile(r"\b(?:" + "|".join(map(re.escape, module.__all__)) + r")\b")
    for notebook, sections in pointers:
        paths = list((ROOT / "solutions").glob(notebook + "*.ipynb"))
        assert len(paths) == 1, (name, notebook)
        code = _code_by_section(paths[0])
        if not sections:
            assert uses.search("\n".join(code.values())), f"{name}: no code cell of {notebook} uses it"
        for k in sections:
            assert uses.search(code.get(k, "")), f"{name}: taught in {notebook} §{k}, but no code cell there uses it"


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
