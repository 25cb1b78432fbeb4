"""The package layout and the size limits that cannot slip (CONTRIBUTING "House rules", issue 49).

- the import graph: ``course_utils`` imports neither ``course_tools`` nor ``course_grader``; ``course_tools`` does not
  import ``course_grader``; no ``.py`` under ``solutions/`` or ``notebooks/homework/`` imports either at module level
  (a copy of a script must run without the course's machinery);
- sizes: every module of ``course_utils``, ``course_tools`` and ``course_grader`` at most 400 lines and every function
  at most 60; ``solutions/homework/train_cifar_pro.py`` at most 650 lines, ``solutions/homework/train_cifar.py`` 300;
- "Taught in NN §k" (in any case) names a section whose code cells (the code, not its comments or strings) use a name
  from the module's ``__all__``.

Each rule is a function over sources or paths; the ``test_rule_*`` tests show each one failing on a mutation.
"""
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
from tests.support.notebook_cells import SECTION

ROOT = Path(__file__).resolve().parent.parent


def _modules(package) -> list[str]:
    found = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        found.append(info.name)
    return found


PACKAGES = ("course_utils", "course_tools", "course_grader")
MODULE_LINES, FUNCTION_LINES = 400, 60
SCRIPT_LINES = {"solutions/homework/train_cifar_pro.py": 650, "solutions/homework/train_cifar.py": 300}
# whole packages: the notebook runtime's ceiling (issue 49) and the grader's target (issue 48)
PACKAGE_LINES = {"course_tools": 6500, "course_grader": 4500}
# who may not import whom, anywhere in the package (function-local imports included)
FORBIDDEN = {"course_utils": {"course_tools", "course_grader"}, "course_tools": {"course_grader"}}
MACHINERY = {"course_tools", "course_grader"}  # what scripts a learner copies may not import at module level


def _package_files(package: str) -> list[Path]:
    """The package's modules as they exist in this tree (``course_grader`` only once it does)."""
    return sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []


def upward_imports(source: str, package: str) -> set[str]:
    """The modules that a module of ``package`` (its source) imports against ``FORBIDDEN``, relative ones resolved."""
    forbidden = FORBIDDEN.get(package.split(".")[0], set())
    return {n for n in _imported_names(source, package) if n.split(".")[0] in forbidden}


def module_level_imports(source: str) -> set[str]:
    """Modules imported when the module is imported: every import outside function bodies (class bodies, ``if`` and
    ``try`` blocks at the top run at import time too)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level:
                names.add(child.module or "")
            visit(child)
    visit(ast.parse(source))
    return names


def long_functions(source: str, limit: int = FUNCTION_LINES) -> dict[str, int]:
    """Every function (methods and nested ones included) longer than ``limit`` lines, from ``def`` to its last line."""
    return {f"{node.name}:{node.lineno}": node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit}


def line_count(source: str) -> int:
    return len(source.splitlines())


def package_lines(files: list[Path]) -> int:
    """A package's lines, every module of every subpackage (what ``wc -l`` sums)."""
    return sum(line_count(path.read_text(encoding="utf-8")) for path in files)


def test_no_package_imports_upwards():
    """The import graph, statically (every import statement, also inside functions)."""
    offenders = {}
    for package in FORBIDDEN:
        for path in _package_files(package):
            bad = upward_imports(path.read_text(encoding="utf-8"), ".".join(path.relative_to(ROOT).parts[:-1]))
            if bad:
                offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_importing_every_course_utils_module_loads_no_course_machinery():
    """The import graph, dynamically: a fresh interpreter imports all of course_utils."""
    code = ("import importlib, sys\n"
            f"for m in {_modules(course_utils)!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(MACHINERY)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_scripts_a_learner_copies_import_no_course_machinery_at_module_level():
    """A script of solutions/ or the learner's homework folder runs without the course's machinery; what a test
    needs comes in inside a function (the professional script's probes: only with a hidden flag)."""
    paths = sorted((ROOT / "solutions").rglob("*.py")) + sorted((ROOT / "notebooks" / "homework").rglob("*.py"))
    assert any(p.name == "train_cifar_pro.py" for p in paths)
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in module_level_imports(p.read_text(encoding="utf-8"))
                                                  if n.split(".")[0] in MACHINERY) for p in paths}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_every_module_and_function_within_its_size():
    too_long = {}
    for package in PACKAGES:
        for path in _package_files(package):
            source = path.read_text(encoding="utf-8")
            where = str(path.relative_to(ROOT))
            if line_count(source) > MODULE_LINES:
                too_long[where] = line_count(source)
            too_long |= {f"{where}::{name}": n for name, n in long_functions(source).items()}
    assert too_long == {}, f"over {MODULE_LINES} lines a module, {FUNCTION_LINES} a function: make it a component"


@pytest.mark.parametrize("package", sorted(PACKAGE_LINES))
def test_each_package_within_its_ceiling(package):
    total = package_lines(_package_files(package))
    assert total <= PACKAGE_LINES[package], f"{package}: {total} lines, ceiling {PACKAGE_LINES[package]}"


def test_rule_package_ceiling_fails_one_line_over(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n" * 6000)
    (tmp_path / "sub" / "b.py").write_text("y = 2\n" * 500)  # a subpackage's module counts too
    assert package_lines(sorted(tmp_path.rglob("*.py"))) == 6500 <= PACKAGE_LINES["course_tools"]
    (tmp_path / "sub" / "b.py").write_text("y = 2\n" * 501)
    assert package_lines(sorted(tmp_path.rglob("*.py"))) > PACKAGE_LINES["course_tools"]


@pytest.mark.parametrize("script", sorted(SCRIPT_LINES))
def test_the_homework_scripts_within_their_size(script):
    source = (ROOT / script).read_text(encoding="utf-8")
    assert line_count(source) <= SCRIPT_LINES[script], line_count(source)
    if script.endswith("_pro.py"):  # the learner's answer is one main() by design, the professional script is not
        assert long_functions(source) == {}


def test_rule_sizes_fail_on_a_61_line_function_and_a_401_line_module():
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    assert long_functions(f"def f():\n{body}\n") == {}, "60 lines: the limit itself"
    assert long_functions(f"def f():\n{body}\n    return 1\n") == {"f:1": 61}
    nested = "class C:\n    def m(self):\n" + "\n".join(f"        y{i} = {i}" for i in range(60)) + "\n"
    assert long_functions(nested) == {"m:2": 61}, "a method counts"
    assert line_count("x = 1\n" * 401) > MODULE_LINES >= line_count("x = 1\n" * 400)


def test_rule_module_level_imports_fail_on_a_top_level_import_only():
    assert module_level_imports("import os\nfrom course_tools.probes import Probes\n") == {"os", "course_tools.probes"}
    guarded = "try:\n    import course_grader.cli\nexcept ImportError:\n    pass\nclass A:\n    import course_tools\n"
    assert module_level_imports(guarded) == {"course_grader.cli", "course_tools"}, "try blocks and class bodies run"
    lazy = "def hooks():\n    from course_tools.probes import Probes\n    return Probes\n"
    assert module_level_imports(lazy) == set(), "inside a function: only when called"


def test_rule_upward_imports_fail_on_each_forbidden_edge():
    assert upward_imports("def f():\n    from course_tools.checks import expect\n", "course_utils") == {"course_tools.checks"}
    assert upward_imports("import course_grader.report\n", "course_utils.resume_doctor") == {"course_grader.report"}
    assert upward_imports("from course_grader import cli\n", "course_tools.lab") == {"course_grader"}
    assert upward_imports("from ..course_grader import cli\n", "course_tools.lab") == set(), "resolves to course_tools"
    assert upward_imports("import course_utils\n", "course_tools") == set()
    assert upward_imports("import course_tools\n", "course_grader") == set(), "the grader may use the runtime"


def _imported_names(source: str, package: str) -> set[str]:
    """Every module named by an import statement of ``source`` (a module of ``package``); relative ones resolved."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
    return names


def test_static_check_would_catch_an_upward_import():
    """The static check is not vacuous: it sees function-local and relative imports too."""
    source = ("import os\ndef f():\n    from course_tools.checks import expect\n"
              "from ..course_tools import noninteractive\n")
    assert {"os", "course_tools.checks", "pkg.course_tools"} <= _imported_names(source, "pkg.sub")
    release = (ROOT / "course_tools" / "release.py").read_text(encoding="utf-8")
    assert "course_tools.noninteractive" in _imported_names(release, "course_tools")


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) + _modules(course_tools)
                                  if not m.rsplit(".", 1)[-1].startswith("_") and "." in m])
def test_public_modules_declare_all(name):
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def code_names(source: str) -> set[str]:
    """The names a cell's code uses: variables, attributes, imported names (comments and strings are not code).
    IPython lines (``%magic``, ``!shell``) are left out."""
    kept = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    names: set[str] = set()
    for node in ast.walk(ast.parse(kept)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names |= {node.name.rsplit(".", 1)[-1], node.asname or node.name}
    return names


def names_by_section(cells: list[tuple[str, str]]) -> dict[int, set[str]]:
    """The names the code cells of each numbered section (``## k. ...``) use; 0: before the first heading.
    ``cells``: (cell type, source), a notebook's cells in order."""
    found: dict[int, set[str]] = {}
    current: int | None = 0
    for kind, source in cells:
        if kind == "markdown" and re.search(r"^## ", source, flags=re.MULTILINE):
            m = SECTION.search(source)
            current = int(m.group(1)) if m else None  # an unnumbered section (练习, 纪律) has no number to point at
        elif kind == "code" and current is not None:
            found.setdefault(current, set()).update(code_names(source))
    return found


_NOTEBOOK = re.compile(r"(?<![§\d–-])`{0,2}(\d\d[a-z]?)(?![\d%])(?:_\w*)?`{0,2}")


def taught_in(doc: str) -> list[tuple[str, list[int]]]:
    """Every pointer of every "Taught in ``NN_name`` §a–b (...), §c, ``MM`` ..." paragraph, in any case and with or
    without the notebook's name: (NN, sections); no section: the notebook as a whole."""
    pointers = []
    for start in (m.end() for m in re.finditer(r"taught in", doc, flags=re.IGNORECASE)):
        paragraph = doc[start:].split("\n\n")[0]
        while re.search(r"\([^()]*\)", paragraph):  # what a parenthesis says is not a pointer
            paragraph = re.sub(r"\([^()]*\)", "", paragraph)
        parts = _NOTEBOOK.split(paragraph)
        pointers += [(notebook, [k for a, b in re.findall(r"§(\d+)(?:[–-](\d+))?", text)
                                 for k in range(int(a), max(int(a), int(b or a)) + 1)])
                     for notebook, text in zip(parts[1::2], parts[2::2])]
    return pointers


def false_pointers(doc: str, exported: list[str], notebooks: dict[str, dict[int, set[str]]]) -> list[str]:
    """What is wrong with a module's "Taught in" pointers: a notebook that does not exist, or a section (the whole
    notebook when none is named) whose code cells use no name of ``exported``. ``notebooks``: NN -> names by section."""
    wrong = []
    for notebook, sections in taught_in(doc):
        if notebook not in notebooks:
            wrong.append(f"{notebook}: no such notebook")
            continue
        by_section = notebooks[notebook]
        for k in sections or [None]:
            used = set().union(*by_section.values()) if k is None else by_section.get(k, set())
            if not used & set(exported):
                wrong.append(f"{notebook} §{k}" if k is not None else f"{notebook}: no code cell uses it")
    return wrong


def _solution_notebooks() -> dict[str, dict[int, set[str]]]:
    found = {}
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        cells = [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]
        found[path.name.split("_")[0]] = names_by_section(cells)
    return found


def _documented_modules() -> list[str]:
    found = []
    for package in PACKAGES:
        if (ROOT / package).is_dir():
            found += [m for m in _modules(importlib.import_module(package)) if "." in m and not m.endswith("__main__")]
    return found


def test_every_taught_in_pointer_is_true():
    """d2l's rule, for every module of the three packages: "Taught in NN §k" holds when a code cell of section k
    (each section a range names) uses a name of the module's ``__all__``; "Taught in NN" alone, some code cell of NN."""
    notebooks, wrong = _solution_notebooks(), {}
    for name in _documented_modules():
        module = importlib.import_module(name)
        doc = module.__doc__ or ""
        if re.search(r"taught in", doc, flags=re.IGNORECASE):
            assert taught_in(doc), f"{name}: 'taught in' names no notebook"
            wrong[name] = false_pointers(doc, getattr(module, "__all__", []), notebooks)
    assert {k: v for k, v in wrong.items() if v} == {}


@pytest.mark.parametrize("name", [m for m in _modules(course_utils) if "." in m])
def test_each_helper_says_where_it_is_taught(name):
    """A course_utils module no notebook uses says it is reference machinery and names the script that runs it."""
    doc = importlib.import_module(name).__doc__ or ""
    if not re.search(r"taught in", doc, flags=re.IGNORECASE):
        scripts = re.findall(r"``((?:solutions|course_tools)/[\w/.]+\.py)``", doc)
        assert "Reference machinery" in doc and scripts, f"{name}: say where it is taught, or whose machinery it is"
        assert all((ROOT / s).is_file() for s in scripts), (name, scripts)


def test_rule_taught_in_fails_on_a_section_whose_code_only_mentions_the_name():
    cells = [("markdown", "## 1. 起步"), ("code", "x = helper(1)  # not read_heartbeats"),
             ("markdown", "## 2. 心跳"), ("code", "print('read_heartbeats')\n%time y = 1"),
             ("markdown", "## 3. 看门狗"), ("code", "from course_utils.heartbeat import read_heartbeats as rh")]
    notebooks = {"11": names_by_section(cells)}
    exported = ["read_heartbeats", "PHASES"]
    assert false_pointers("Taught in ``11_multi_process`` §3.", exported, notebooks) == []
    assert false_pointers("Taught in ``11_multi_process`` §2.", exported, notebooks) == ["11 §2"], "a string is no use"
    assert false_pointers("taught in 11 §1 (a rank frozen live).", exported, notebooks) == ["11 §1"], "a comment neither"
    assert false_pointers("TAUGHT IN 11 §1–3", exported, notebooks) == ["11 §1", "11 §2"], "any case, a range"
    assert false_pointers("Taught in ``11_multi_process``.", exported, notebooks) == [], "the notebook as a whole"
    assert false_pointers("Taught in ``11_multi_process``.", ["PHASES"], notebooks) == ["11: no code cell uses it"]
    assert false_pointers("Taught in ``14_nothing`` §2.", exported, notebooks) == ["14: no such notebook"]
    assert taught_in("Taught in ``08b_flops_memory`` §2 and ``12_loss_spikes`` §5 (the 20% case).") == [
        ("08b", [2]), ("12", [5])]


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
