"""Find every learner and submitted notebook under the submission folders, and account for every file met.

Learner folders sit at the depth where most notebooks are (``alice/`` or ``sec1/alice/``: one stray notebook at
the top hides nothing), keyed by their path below the root (prefixed by the root's name when several are given).
Each learner gets one :class:`Item` per graded reference, submitted or not (missing counts 0, never exempt).
Notebooks match by exact name, then case, then number (``2_x (1).ipynb``), then topic; a nested one counts when
none is at the top. Everything else is a :class:`Finding`: hidden files, symlinks (refused: a link to the
reference would score full marks), a second copy (the best match graded, the row flagged for review), strays.
The homework item takes the first form present (:data:`FORMS`): a bundle, a clone with or without ``.git`` (only
its ``notebooks/`` is looked at), a ``homework/`` folder; another form is reported, never graded.

Example::

    items, findings = collect([Path("submissions")], sorted(Path("solutions").glob(NOTEBOOK_GLOB)))
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Item", "Finding", "FORMS", "collect", "reference_number", "is_clone"]

_MAX_DEPTH = 4          # folders below a learner folder that are searched for notebooks
_MAX_ENTRIES = 5000     # entries looked at per learner
_HIDDEN = ("__MACOSX",)
# Homework forms, most complete first (history beats none); the description goes into grades.files.csv.
FORMS = {"bundle": "作业: git bundle(含提交历史)", "clone-git": "作业: 练习册克隆(含 .git 提交历史)",
         "clone": "作业: 练习册克隆(没有 .git)", "folder": "作业: homework/ 文件夹(没有提交历史)"}


@dataclass
class Item:
    """One row to grade: ``learner`` x ``reference``; ``path`` None when nothing was submitted. The homework's
    ``form`` is a key of :data:`FORMS`, its ``path`` the bundle, the clone's root or the ``homework/`` folder."""

    learner: str
    reference: Path
    path: Path | None = None
    notes: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)
    form: str = ""


@dataclass
class Finding:
    """A file or folder met while collecting: ``status`` is graded, reported or refused."""

    path: str
    learner: str
    status: str
    reason: str


def reference_number(name: str) -> str | None:
    """The leading number of a notebook name, with its letter: ``02_x.ipynb`` -> "2", ``2_x`` -> "2",
    ``08b_x`` and ``8B_x`` -> "8b" (08b is not 08), ``x.ipynb`` -> None."""
    match = re.match(r"\s*(\d+)([a-z]?)(?![\da-z])", name, flags=re.IGNORECASE)
    return f"{int(match.group(1))}{match.group(2).casefold()}" if match else None


def _topic(reference: Path) -> str:
    return re.sub(r"^\d+[a-z]?_", "", reference.stem).casefold()


def _is_notebook(name: str) -> bool:
    return name.casefold().endswith(".ipynb")


def _hidden(name: str) -> bool:
    return name.startswith(".") or name in _HIDDEN


def is_clone(path: Path) -> bool:
    """A learner's clone of the workbook: a real folder holding a real ``notebooks/`` folder."""
    notebooks = Path(path) / "notebooks"
    return not Path(path).is_symlink() and notebooks.is_dir() and not notebooks.is_symlink()


def _is_bundle(entry: os.DirEntry) -> bool:
    return entry.name.casefold().endswith(".bundle") and entry.is_file(follow_symlinks=False)


def _match(name: str, references: list[Path]) -> tuple[Path | None, int, str]:
    """(reference, rank, reason): rank 0 exact, 1 case, 2 number, 3 topic; None with a reason otherwise."""
    for rank, key in enumerate((str, str.casefold)):     # exact, then ignoring case
        for ref in references:
            if key(name) == key(ref.name):
                return ref, rank, ""
    stem = name[: -len(".ipynb")].casefold()
    number = reference_number(stem)
    by_topic = [r for r in references if _topic(r) and _topic(r) in stem]
    if number is not None:
        by_number = [r for r in references if reference_number(r.name) == number]
        if len(by_number) == 1:
            if by_topic and by_number[0] not in by_topic:
                return None, 9, f"编号指向 {by_number[0].name},名字却像 {by_topic[0].name},无法确定"
            return by_number[0], 2, ""
    if len(by_topic) == 1:
        return by_topic[0], 3, ""
    return None, 9, "无法对应到任何参考 notebook"


class _Collector:
    def __init__(self, references: list[Path], graded: set[str], homework: str | None = None) -> None:
        self.references, self.graded, self.homework = references, graded, homework
        self.items: list[Item] = []
        self.findings: list[Finding] = []

    def report(self, path: str, learner: str, reason: str, status: str = "reported") -> None:
        self.findings.append(Finding(path, learner, status, reason))

    def learner(self, key: str, display: str, files: list[tuple[Path, str, int]], extra: list[Finding],
                forms: list[tuple[str, Path, str]] = ()) -> None:
        """``files``: (path, display path, depth) of the learner's notebooks (symlinks included, refused here);
        ``forms``: (form, path, display path) of the homework found."""
        chosen: dict[str, list[tuple[int, int, str, Path]]] = {}
        refused: dict[str, list[str]] = {}
        unmatched: list[str] = []
        for path, shown, depth in files:
            ref, rank, reason = _match(path.name, self.references)
            if path.is_symlink():
                self.report(shown, key, "符号链接,已拒绝(不跟随链接)", "refused")
                if ref is not None:
                    refused.setdefault(ref.name, []).append(shown)
                continue
            if ref is None:
                self.report(shown, key, reason)
                unmatched.append(shown)
            elif ref.name not in self.graded:
                self.report(shown, key, f"{ref.name} 没有 check 格子,不计分")
            else:
                chosen.setdefault(ref.name, []).append((depth, rank, shown, path))
        self.findings += extra
        for ref in self.references:
            if ref.name not in self.graded:
                continue
            item = Item(key, ref)
            candidates = sorted(chosen.get(ref.name, []), key=lambda c: (c[0], c[1], len(c[2]), c[2]))
            if candidates:
                depth, rank, shown, path = candidates[0]
                item.path = path
                self.report(shown, key, f"批改为 {ref.name}", "graded")
                if rank or depth:
                    item.notes.append(f"文件名或位置不规范: {shown},按 {ref.name} 批改")
                for _, _, other, _ in candidates[1:]:
                    self.report(other, key, f"重复: {ref.name} 已批改 {shown},这个文件未批改")
                if len(candidates) > 1:
                    item.review.append(f"同一 notebook 有 {len(candidates)} 个文件,批改的是 {shown},"
                                       f"未批改: {', '.join(c[2] for c in candidates[1:])}")
            else:
                item.notes.append(f"未提交 {ref.name}")
                if ref.name in refused:
                    item.notes.append(f"{', '.join(refused[ref.name])} 是符号链接,已拒绝")
                if unmatched:
                    item.notes.append(f"无法对应的文件: {', '.join(unmatched)}")
            self.items.append(item)
        if self.homework:
            self.homework_item(key, list(forms))

    def homework_item(self, key: str, forms: list[tuple[str, Path, str]]) -> None:
        item = Item(key, Path(self.homework))
        forms.sort(key=lambda f: (list(FORMS).index(f[0]), len(f[2]), f[2]))
        if forms:
            item.form, item.path, shown = forms[0]
            self.report(shown, key, FORMS[item.form] + ",已批改", "graded")
            for form, _, other in forms[1:]:
                self.report(other, key, f"另一份作业({FORMS[form]}),未批改: 已批改 {shown}")
                item.review.append(f"作业交了不止一份,批改的是 {shown},未批改 {other}")
        else:
            item.notes.append("未提交作业(homework/ 文件夹、练习册克隆或 *.bundle)")
        self.items.append(item)

    def clone(self, root: Path, key: str, shown: str, files: list[tuple[Path, str, int]], extra: list[Finding],
              forms: list[tuple[str, Path, str]]) -> None:
        """A clone of the workbook: its notebooks in ``notebooks/`` and its scripts in ``notebooks/homework/``."""
        git = (root / ".git").is_dir() and not (root / ".git").is_symlink()
        extra.append(Finding(shown, key, "reported", "练习册克隆: 只看 notebooks/ 里的 notebook 和 notebooks/homework/"
                             + (";.git 用于检查提交历史" if git else "")))
        try:
            entries = sorted(os.scandir(root / "notebooks"), key=lambda e: e.name)[:_MAX_ENTRIES]
        except OSError:
            entries = []
        for entry in entries:
            path = Path(entry.path)
            if entry.name == "homework" and entry.is_dir(follow_symlinks=False):
                forms.append(("clone-git" if git else "clone", root, _join(shown, "notebooks/homework")))
            elif _is_notebook(entry.name) and not _hidden(entry.name) and (entry.is_symlink() or entry.is_file()):
                files.append((path, _join(shown, f"notebooks/{entry.name}"), 0))

    def learner_folder(self, folder: Path, key: str, shown_root: str) -> None:
        files: list[tuple[Path, str, int]] = []
        extra: list[Finding] = []
        forms: list[tuple[str, Path, str]] = []
        budget = [_MAX_ENTRIES]

        def walk(d: Path, depth: int) -> None:
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as exc:
                extra.append(Finding(_join(shown_root, d.relative_to(folder)), key, "reported", f"无法读取: {exc}"))
                return
            for entry in entries:
                budget[0] -= 1
                path = Path(entry.path)
                shown = _join(shown_root, path.relative_to(folder))
                if budget[0] < 0:
                    extra.append(Finding(shown, key, "reported", "文件太多,之后的文件未查看"))
                    return
                if _hidden(entry.name):
                    extra.append(Finding(shown, key, "reported", "隐藏文件或文件夹,未批改"))
                elif entry.is_symlink():
                    if _is_notebook(entry.name):
                        files.append((path, shown, depth))
                    else:
                        extra.append(Finding(shown, key, "refused", "符号链接,已拒绝(不跟随链接)"))
                elif depth == 0 and entry.name == "homework" and entry.is_dir(follow_symlinks=False):
                    forms.append(("folder", path, shown))
                elif depth == 0 and _is_bundle(entry):
                    forms.append(("bundle", path, shown))
                elif depth == 0 and entry.is_dir(follow_symlinks=False) and is_clone(path):
                    self.clone(path, key, shown, files, extra, forms)
                elif entry.is_dir(follow_symlinks=False):
                    if depth + 1 > _MAX_DEPTH:
                        extra.append(Finding(shown, key, "reported", "文件夹层级太深,未查看"))
                    else:
                        walk(path, depth + 1)
                elif entry.is_file(follow_symlinks=False) and _is_notebook(entry.name):
                    files.append((path, shown, depth))
                else:
                    extra.append(Finding(shown, key, "reported", "不是 notebook,未批改"))

        if is_clone(folder):
            self.clone(folder, key, shown_root, files, extra, forms)
        else:
            walk(folder, 0)
        self.learner(key, shown_root, files, extra, forms)

    def root(self, folder: Path, prefix: str, shown_root: str) -> None:
        """A submission folder: learner folders sit at the depth where most notebooks' folders are."""
        depth = 0 if is_clone(folder) else _learner_depth(folder)
        if depth == 0:
            self.learner_folder(folder, prefix or folder.name, shown_root)
        else:
            self.level(folder, prefix, shown_root, depth)

    def level(self, folder: Path, prefix: str, shown_root: str, depth: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            self.report(shown_root, "", f"无法读取: {exc}")
            return
        for entry in entries:
            path = Path(entry.path)
            shown = _join(shown_root, entry.name)
            key = f"{prefix}/{entry.name}" if prefix else entry.name
            if _hidden(entry.name):
                self.report(shown, "", "隐藏文件或文件夹,未批改(不当作学员)")
            elif entry.is_symlink():
                self.report(shown, "", "符号链接,已拒绝(不跟随链接)", "refused")
            elif entry.is_dir(follow_symlinks=False):
                if depth == 1:
                    self.learner_folder(path, key, shown)
                else:
                    self.level(path, key, shown, depth - 1)
            elif _is_notebook(entry.name):
                self.report(shown, "", "不在学员文件夹里的 notebook(例如放在提交根目录下),未批改;学员文件夹照常批改")
            else:
                self.report(shown, "", "不是学员文件夹,未批改")


def _join(root: str, rel: Path | str) -> str:
    rel = str(rel)
    return rel if not root else (root if rel in ("", ".") else f"{root}/{rel}")


def _learner_depth(folder: Path) -> int:
    """The most common depth below ``folder`` of the folders holding notebooks, a ``homework/`` folder or a bundle (a
    clone counts once, for the folder holding it); ties go to the shallower, 0 only when no subfolder holds one."""
    counts: dict[int, int] = {}
    budget = [_MAX_ENTRIES * 4]

    def walk(d: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for entry in entries:
            budget[0] -= 1
            if budget[0] < 0 or _hidden(entry.name) or entry.is_symlink():
                continue
            if (entry.is_file(follow_symlinks=False) and _is_notebook(entry.name)) or _is_bundle(entry) or (
                    entry.name == "homework" and entry.is_dir(follow_symlinks=False)):
                counts[depth] = counts.get(depth, 0) + 1
            elif entry.is_dir(follow_symlinks=False) and is_clone(Path(entry.path)):
                counts[max(depth, 1)] = counts.get(max(depth, 1), 0) + 1
            elif entry.is_dir(follow_symlinks=False) and depth < _MAX_DEPTH + 2:
                walk(Path(entry.path), depth + 1)

    walk(folder, 0)
    below = {d: n for d, n in counts.items() if d > 0}
    return max(below, key=lambda d: (below[d], -d)) if below else (0 if counts else 1)


def _labels(paths: list[Path]) -> list[str]:
    """The shortest path suffixes that tell the roots apart (``sec1``, ``sec2``; ``a/x``, ``b/x``)."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    labels = []
    for mine in parts:
        for k in range(1, len(mine) + 1):
            label = "/".join(mine[-k:])
            if sum("/".join(other[-k:]) == label for other in parts) == 1:
                break
        labels.append(label)
    return labels


def collect(paths: list[Path], references: list[Path], graded: set[str] | None = None,
            homework: str | None = None) -> tuple[list[Item], list[Finding]]:
    """Items (learner x graded reference) and findings (every file met) under ``paths``. ``graded``: the references
    with check cells (default: all); ``homework``: the homework's row name (None: not graded)."""
    references = sorted(references)
    collector = _Collector(references, {r.name for r in references} if graded is None else set(graded), homework)
    first: dict[str, Path] = {}
    for p in paths:
        first.setdefault(os.path.abspath(p), Path(p))   # each root once, as first given
    unique = list(first.values())
    for path, label in zip(unique, _labels(unique)):
        if path.is_symlink():
            collector.report(label, label, "符号链接,已拒绝(不跟随链接)", "refused")
        elif path.is_file() and path.name.casefold().endswith(".bundle"):
            collector.learner(label, label, [], [], [("bundle", path, label)])
        elif path.is_file():
            collector.learner(label, label, [(path, label, 0)], [])
        elif path.is_dir():
            collector.root(path, label if len(unique) > 1 else "", label)
        else:
            collector.report(label, "", "不存在")
    return collector.items, collector.findings
