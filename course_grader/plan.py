"""The notebook the grader runs (:class:`Plan`): the released reference with only the learner's exercise sources
put in (:func:`merge_exercises`), so a learner's edit of a check cell changes nothing.

Example::

    paths, released = references(Path("solutions"))
    plan = make_plan(released["01_amp.ipynb"], read_notebook(Path("alice/01_amp.ipynb")))
"""
from __future__ import annotations

import ast
import codecs
import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat

from course_tools.cells import CHECK, EXERCISE, NOTEBOOK_GLOB, tagged
from course_grader.answers import OutsideCheck, outside_check
from course_grader.scan import Flag, scan
from course_tools.release import learner_notebook

if TYPE_CHECKING:
    from course_grader.steps import Submission

__all__ = ["UnreadableNotebook", "cell_source", "references", "read_notebook", "merge_exercises", "Plan",
           "make_plan", "check_labels", "check_function", "step"]

_MAX_SOURCE = 100_000  # characters of one exercise cell
_MAX_BYTES = 50 * 2 ** 20  # one submitted notebook file


class UnreadableNotebook(ValueError):
    """A submitted file that is not a readable notebook; ``str()`` says why, in Chinese."""


def cell_source(cell: dict) -> str:
    """A cell's source as one string (whatever shape the file gave it)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source if isinstance(source, str) else ""


def _defined(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def references(solutions: Path) -> tuple[list[Path], dict[str, nbformat.NotebookNode]]:
    """Every ``NN_*.ipynb`` in ``solutions`` and the released copies of those with check cells; a malformed
    reference raises :class:`AuthoringError` (a grading run must not start on one)."""
    paths = sorted(p for p in Path(solutions).glob(NOTEBOOK_GLOB) if p.is_file())
    released = {path.name: learner_notebook(nbformat.read(path, as_version=4), path.name) for path in paths}
    return paths, {name: nb for name, nb in released.items() if any(tagged(c, CHECK) for c in nb.cells)}


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """``path`` as an nbformat v4 notebook (v3 converted; BOM and UTF-16 accepted), never following a symlink."""
    if path.is_symlink():
        raise UnreadableNotebook("符号链接,已拒绝")
    size = path.stat().st_size
    if size > _MAX_BYTES:
        raise UnreadableNotebook(f"文件过大({size / 2 ** 20:.0f} MiB)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableNotebook(f"不是 UTF-8 文本: {exc.reason}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.convert(nbformat.reader.reads(text), 4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds for bad input
        raise UnreadableNotebook(f"不是有效的 notebook JSON: {str(exc)[:120]}") from None
    if not isinstance(nb.get("cells"), list) or not all(isinstance(c, dict) for c in nb.cells):
        raise UnreadableNotebook("不是有效的 notebook JSON: 没有 cells 列表")
    return nb


def merge_exercises(released: nbformat.NotebookNode, submission: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[str]]:
    """``released`` with the learner's exercise sources put in, matched by cell id, then by the functions they
    define, then by order (not found: the stub stays); (notebook, notes)."""
    graded = copy.deepcopy(released)
    ref_ex = [c for c in graded.cells if tagged(c, EXERCISE)]
    sub_code = [c for c in submission.get("cells", []) if isinstance(c, dict) and c.get("cell_type") == "code"]
    by_id = {c["id"]: c for c in sub_code if isinstance(c.get("id"), str)}
    slots: list = [by_id.get(c.get("id")) for c in ref_ex]
    used = {id(hit) for hit in slots if hit is not None}
    by_name = by_order = 0
    for k, cell in enumerate(ref_ex):  # then a cell defining the same function (untagged, v3, copied)
        names = _defined(cell_source(cell))
        if slots[k] is None and names:
            hit = next((c for c in sub_code if id(c) not in used and names & _defined(cell_source(c))), None)
            if hit is not None:
                slots[k], by_name = hit, by_name + 1
                used.add(id(hit))
    remaining = [c for c in sub_code if tagged(c, EXERCISE) and id(c) not in used]
    for k in range(len(ref_ex)):
        if slots[k] is None and remaining:
            slots[k], by_order = remaining.pop(0), by_order + 1
    notes = []
    too_long = [k + 1 for k, hit in enumerate(slots) if hit is not None and len(cell_source(hit)) > _MAX_SOURCE]
    for cell, hit in zip(ref_ex, slots):
        if hit is not None and len(cell_source(hit)) <= _MAX_SOURCE:
            cell.source = cell_source(hit)
    missing = [k + 1 for k, s in enumerate(slots) if s is None]
    n_sub = sum(tagged(c, EXERCISE) for c in sub_code)
    if by_name or by_order or missing or n_sub != len(ref_ex):
        notes.append(f"练习格子与参考不一致(旧版本?): 参考 {len(ref_ex)} 个,提交 {n_sub} 个;按 id 匹配 "
                     f"{len(ref_ex) - by_name - by_order - len(missing)} 个,按函数名匹配 {by_name} 个,按顺序匹配 {by_order} 个"
                     + (f",未找到练习 {missing}(按未完成计分)" if missing else ""))
    if too_long:
        notes.append(f"练习 {too_long} 的代码超过 {_MAX_SOURCE} 个字符,按未完成计分")
    return graded, notes


@dataclass
class Plan:
    """The notebook to run for one submission and what the grader knows about its cells."""

    notebook: nbformat.NotebookNode
    exercises: list[int]
    checks: list[int]
    stubs: dict[int, str]
    owner: dict[int, int | None]          # check index -> the exercise before it
    outside: dict[int, OutsideCheck]      # check index -> scored by the grader, not the kernel
    flags: dict[int, list[Flag]]          # exercise index -> suspicious lines
    notes: list[str]

    def code_cells(self, stubbed: dict[int, str]) -> list[tuple[int, str]]:
        """(index, source) of the code cells to run, the exercises in ``stubbed`` as their stubs."""
        return [(i, self.stubs[i] if i in stubbed else cell_source(c)) for i, c in enumerate(self.notebook.cells)
                if c.get("cell_type") == "code" and cell_source(c).strip()]

    def exercise_sources(self) -> list[str]:
        """The exercises' sources as merged (the learner's), in order."""
        return [cell_source(self.notebook.cells[e]) for e in self.exercises]

    def label(self, index: int) -> str:
        cell = self.notebook.cells[index]
        if index in self.exercises:
            return f"练习 {self.exercises.index(index) + 1}({cell.get('id', index)})"
        if index in self.checks:
            return str(cell.get("id") or f"check {self.checks.index(index) + 1}")
        return f"格子 {index}({cell.get('id', '-')})"


def make_plan(released: nbformat.NotebookNode, submission: nbformat.NotebookNode) -> Plan:
    """Merge, find the check and exercise cells, scan the learner's exercise sources."""
    notebook, notes = merge_exercises(released, submission)
    exercises = [i for i, c in enumerate(notebook.cells) if tagged(c, EXERCISE)]
    checks = [i for i, c in enumerate(notebook.cells) if tagged(c, CHECK)]
    stubs = {i: cell_source(released.cells[i]) for i in exercises}
    owner = {c: max((e for e in exercises if e < c), default=None) for c in checks}
    outside = {c: o for c in checks if (o := outside_check(cell_source(notebook.cells[c]))) is not None}
    flags = {i: f for i in exercises if (f := scan(cell_source(notebook.cells[i])))}
    return Plan(notebook, exercises, checks, stubs, owner, outside, flags, notes)


def check_function(source: str) -> str:
    """``nb01_amp.check_amp_train_step``: the check module function a check cell calls, or ''."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    imported = {alias.asname or alias.name: f"{node.module.rsplit('.', 1)[1]}.{alias.name}"
                for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("course_tools.checks.nb") for alias in node.names}
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return next((imported[name] for name in calls if name in imported and name.startswith("check_")), "")


def check_labels(released: nbformat.NotebookNode) -> list[str]:
    """The check column of each check cell of ``released`` when nothing ran (its id, or ``check k``)."""
    return [str(c.get("id") or f"check {k + 1}") for k, c in enumerate(c for c in released.cells if tagged(c, CHECK))]


def step(sub: Submission) -> None:
    """The notebook's first step: ``sub.plan``; nothing handed in or unreadable: every check fails with the reason."""
    if sub.item.path is None:
        return sub.unrun(check_labels(sub.released), "未提交")
    try:
        submission = read_notebook(sub.item.path)
    except (UnreadableNotebook, OSError) as exc:
        sub.grade.notes.append(f"无法读取: {exc}")
        return sub.unrun(check_labels(sub.released), f"无法读取: {exc}")
    sub.plan = make_plan(sub.released, submission)
    sub.grade.notes += sub.plan.notes
    return None
