"""Generate the learner notebooks in ``notebooks/`` from the solved ones in ``solutions/`` (the single source).

In a learner copy each block between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``raise
NotImplementedError("<hint>")`` (the hint: any text after ``### BEGIN SOLUTION`` on its line, else a default one;
wider than ``WIDTH`` columns, CJK counting two, it is wrapped over several string literals); ``solution-only``
cells and ``# NBVAL_CHECK_OUTPUT`` lines (nbval's marker) are dropped; outputs and execution counts are cleared,
tags (``exercise``, ``check``) kept; a notebook with check cells ends with a cell listing its exercises not passed
yet (``course_tools.progress.still_open``), so a Run All ends with what is left to do.

    python -m course_tools.release            # regenerate notebooks/
    python -m course_tools.release --check    # exit 1 if notebooks/ is stale
    python -m course_tools.release --execute  # re-run solutions/ in place first (COURSE_FAST=1)
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import time
from pathlib import Path

import nbformat

from course_tools.cells import CHECK, EXERCISE, NOTEBOOK_GLOB, SOLUTION_ONLY, tags
from course_tools.claims import STRICT_ENV
from course_tools.progress import width
from course_tools.noninteractive import quiet_environ

__all__ = ["ROOT", "DEFAULT_HINT", "WIDTH", "NBVAL_MARKER", "AuthoringError", "raise_lines", "strip_solutions",
           "learner_notebook", "solution_paths", "render", "execute", "main"]


ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, NOTEBOOKS = ROOT / "solutions", ROOT / "notebooks"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
DEFAULT_HINT = "练习: 请在这里写出你的实现,然后删除这一行"
_BEGIN_RE = re.compile(r"^(\s*)### BEGIN SOLUTION\s*(.*)$")
WIDTH = 100                               # columns of a stub line in the learner copy
NBVAL_MARKER = "# NBVAL_CHECK_OUTPUT"     # nbval compares this cell's output; learners need not see it
_BREAK_AFTER = (";;,,、。::)", " ")      # where a long hint is wrapped: after punctuation, else after a space


class AuthoringError(ValueError):
    """A mistake in a solution notebook that would break the learner copy or its grading."""


def _pieces(hint: str, room: int) -> list[str]:
    """``hint`` cut after punctuation into pieces whose literals fit in ``room`` columns."""
    pieces, current = [], ""
    for ch in hint:
        if current and width(repr(current + ch)) > room:
            cuts = [max(current.rfind(b) for b in chars) + 1 for chars in _BREAK_AFTER]
            cut = next((c for c in cuts if c > len(current) // 2), len(current))  # none in the second half: cut here
            pieces.append(current[:cut])
            current = current[cut:]
        current += ch
    return [*pieces, current]


def raise_lines(indent: str, hint: str) -> list[str]:
    """The stub's ``raise NotImplementedError(hint)``, over several literals when one line is wider than WIDTH.

    Why: a line past the notebook's width wraps mid-word in Jupyter. Pitfall: the pieces are implicitly
    concatenated literals, so the exception's message is the hint unchanged (``ast`` sees one constant).
    Example: ``raise_lines("    ", "提示: 先 unscale_")`` -> ``["    raise NotImplementedError('提示: 先 unscale_')"]``.
    """
    line = f"{indent}raise NotImplementedError({hint!r})"
    if width(line) <= WIDTH:
        return [line]
    inner = indent + " " * 4
    pieces = _pieces(hint, WIDTH - width(inner) - 1)  # one column for the closing bracket
    return [f"{indent}raise NotImplementedError(", *(f"{inner}{p!r}" for p in pieces[:-1]), f"{inner}{pieces[-1]!r})"]


def strip_solutions(source: str) -> str:
    """Replace each BEGIN/END SOLUTION block with an indented ``raise NotImplementedError``.

    Strict, as nbgrader is: a nested ``BEGIN``, an ``END`` without its ``BEGIN`` or a
    missing ``END`` raises :class:`AuthoringError` instead of leaving a stray marker.
    """
    out, inside = [], False
    for number, line in enumerate(source.splitlines(), 1):
        match = _BEGIN_RE.match(line)
        if match:
            if inside:
                raise AuthoringError(f"第 {number} 行: {BEGIN} 嵌套在另一个答案块里(先写 {END})")
            indent, hint = match.group(1), match.group(2).strip() or DEFAULT_HINT
            out.extend(raise_lines(indent, hint))
            inside = True
        elif line.strip().startswith(END):
            if not inside or line.strip() != END:
                raise AuthoringError(f"第 {number} 行: {END} 前面没有对应的 {BEGIN}" if not inside
                                     else f"第 {number} 行: {END} 后面不能有其他文字")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise AuthoringError(f"缺少 {END}")
    return "\n".join(out)


def _where(name: str, index: int, cell: nbformat.NotebookNode) -> str:
    return f"{name} 第 {index} 个格子(id {cell.get('id', '?')})"


def _still_open_cells(stem: str) -> list[nbformat.NotebookNode]:
    """The closing cells of a learner copy: its exercises not passed yet (fixed ids: the copy stays stable)."""
    note = nbformat.v4.new_markdown_cell("## 还没通过的练习\n\n下面这一格按你的进度记录列出本笔记本里还没通过的练习"
                                         "(Run All 跑到这里就是一份待办清单)。")
    code = nbformat.v4.new_code_cell(f"from course_tools.progress import still_open\n\nstill_open({stem!r})")
    note.id, code.id = "still-open-note", "still-open"
    return [note, code]


def learner_notebook(solved: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The released copy of ``solved``: solutions stripped, ``solution-only`` cells dropped, outputs cleared.

    Authoring mistakes raise :class:`AuthoringError` naming ``name`` and the cell: a solution
    block in a cell not tagged ``exercise`` (grading takes only exercise cells from the learner,
    so that exercise could never earn its marks), or a malformed block.
    """
    nb = copy.deepcopy(solved)
    cells = []
    for index, cell in enumerate(nb.cells):
        if SOLUTION_ONLY in tags(cell):
            continue
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            if BEGIN in cell.source and EXERCISE not in tags(cell):
                raise AuthoringError(f"{_where(name, index, cell)}: 含有 {BEGIN},但没有 exercise 标签")
            try:
                cell.source = strip_solutions(cell.source)
            except AuthoringError as exc:
                raise AuthoringError(f"{_where(name, index, cell)}: {exc}") from None
            cell.source = "\n".join(line for line in cell.source.splitlines() if line.strip() != NBVAL_MARKER)
            cell.outputs, cell.execution_count = [], None
        elif BEGIN in cell.source or END in cell.source:
            raise AuthoringError(f"{_where(name, index, cell)}: 答案标记只能出现在代码格子里")
        cells.append(cell)
    if any(CHECK in tags(cell) for cell in cells):
        cells += _still_open_cells(Path(name).stem)
    nb.cells = cells
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    return nb


def solution_paths() -> list[Path]:
    return sorted(SOLUTIONS.glob(NOTEBOOK_GLOB))


def render(path: Path) -> str:
    return nbformat.writes(learner_notebook(nbformat.read(path, as_version=4), path.name)) + "\n"


def execute(path: Path, timeout: int = 300) -> float:
    """Re-run a solution notebook in place with ``COURSE_FAST=1``; returns seconds taken."""
    from nbclient import NotebookClient

    os.environ.update({**quiet_environ(), **STRICT_ENV})  # a false sentence fails the execution
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when notebooks/ is out of date")
    p.add_argument("--execute", action="store_true", help="re-run the solution notebooks first")
    p.add_argument("--only", nargs="*", default=None, help="notebook name prefixes, e.g. 01 02")
    args = p.parse_args(argv)
    paths = [s for s in solution_paths() if not args.only or any(s.name.startswith(o) for o in args.only)]
    stale = []
    for src in paths:
        if args.execute:
            print(f"executing {src.name} ...", flush=True)
            print(f"  {execute(src):.1f} s")
        target = NOTEBOOKS / src.name
        try:
            text = render(src)
        except AuthoringError as exc:
            print(f"编写错误: {exc}", file=sys.stderr)
            return 2
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if args.check and args.only is None:
        expected = {s.name for s in paths}
        stale += [p.name + " (no source in solutions/)" for p in NOTEBOOKS.glob(NOTEBOOK_GLOB)
                  if p.name not in expected]
    if stale:
        print("notebooks/ 已过期,请运行 python -m course_tools.release:\n  " + "\n  ".join(stale))
        return 1
    if args.check:
        print(f"notebooks/ 与 solutions/ 一致 ({len(paths)} 个)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
