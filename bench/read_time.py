"""First-read time of a training script, estimated from counts and calibrated on nanoGPT's ``train.py``.

Issue 49 asks that a first read of ``solutions/homework/train_cifar_pro.py`` take at most 25 minutes, against
about 15 for nanoGPT's ``train.py``. Nobody timed readers, so this bench turns the claim into counts that anyone
can recompute, and prints the two bases that bracket it. It is a yardstick for changes to the script (before
against after, same method), not a measurement of people.

What it counts (Python's ``tokenize`` and ``ast``, the file alone):
- code lines: lines holding a token that is neither a comment, a docstring nor layout; prose lines: the other
  non-blank lines (comment-only and docstring lines);
- code tokens: tokens that are not comments, docstrings or layout; a string literal is one token, an f-string
  too (Python 3.12's tokenize splits it into parts: they are joined back, so every version counts alike);
  prose words: whitespace-separated words of comments and docstrings;
- look-ups: the names a reader must look up in another file of the project: every name imported from the
  project's packages, plus every distinct (project class, attribute) read on an object the file types as one
  (an annotation, an assignment from the class or one of its classmethods, an alias, a field of the file's own
  dataclasses), the attribute being defined in that class or a base.

The two bases, each calibrated so that the reference reads in ``REFERENCE_MINUTES``:
- line basis: ``(code_lines + prose_lines / 2) / L`` with L lines a minute. A prose line reads at twice the pace
  of a code line; a look-up costs nothing (a name is understood where it is used).
- token basis: ``code_tokens / R + prose_words / 200 + 0.25 * lookups`` with R code tokens a minute; prose
  at 200 words a minute, a quarter of a minute per look-up.

The calibration: nanoGPT's ``train.py`` (karpathy/nanoGPT at 3adf61e154c3, 2025-11-12; md5 of the file
e56c85877d9e257d7c37278bd11bbf29, 336 lines) measured with this method, its project packages ``model`` and
``configurator`` (``--reference`` re-measures a copy). nanoGPT is not in this repository, so its counts are
recorded in ``REFERENCE``. The 15 minutes are the issue's estimate for that file, not a timed reading. The
issue's "about 35 minutes" for the script at f406e03 (717 lines) matches the line basis (32.3 min there; the
token basis says 76.0): the 25-minute target was set on a line-like scale.

Limits, read them before quoting a number:
- One point fixes one rate per basis. The other weights (prose at half a code line, 200 words a minute,
  0.25 minutes a look-up) are assumptions: nanoGPT has 7 look-ups, too few to fit their cost. ``--sweep`` shows
  how the token basis moves with them.
- The bases disagree because the scripts differ in kind: a dense line (many keyword arguments) costs the line
  basis what a short one does, and a course script that calls its own components pays a look-up for each name
  the token basis counts, ``ExitCode.FINISHED`` or ``World.rank`` as much as a name whose meaning needs its
  source. torch's and argparse's names are counted for neither file: nanoGPT's reader is assumed to know torch,
  the course's reader not to know ``course_utils``.
- Counts, not comprehension: the order of the functions, names, nesting and control flow are not measured.
  Moving code into a component lowers both bases whether or not the reader needed to see it; keeping every
  knob visible is a reviewer's judgement, not this bench's.
- The typing of objects is static and partial, so it errs both ways: an attribute of an object it cannot type
  is not counted; a name is typed once for the whole file (a name reused for another type is mistyped), any
  ``Cls.x(...)`` call counts as making a ``Cls``, attribute writes count as look-ups like reads, and classes of
  the same name in different modules are merged.

    python bench/read_time.py                                 # the professional script, both bases
    python bench/read_time.py solutions/homework/train_cifar.py --show-lookups
    python bench/read_time.py --reference /path/to/nanoGPT/train.py --sweep
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "solutions" / "homework" / "train_cifar_pro.py"
PACKAGES = ("course_utils", "course_tools")  # the project's packages a course script imports from
REFERENCE_PACKAGES = ("model", "configurator")  # nanoGPT's own modules
REFERENCE_MINUTES = 15.0
# nanoGPT train.py at 3adf61e, measured by this file's measure() (python bench/read_time.py --reference ...)
REFERENCE = {"lines": 336, "code_lines": 232, "prose_lines": 77, "code_tokens": 1710, "prose_words": 826,
             "lookups": 7}
PROSE_LINE_WEIGHT, WORDS_PER_MINUTE, LOOKUP_MINUTES = 0.5, 200.0, 0.25
LAYOUT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
FSTRING_START, FSTRING_END = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)  # 3.12+


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of every module, class and function docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def tokens(source: str) -> Iterator[tuple[int, str, int, int]]:
    """(type, string, first line, last line) of every token, an f-string as one STRING token on every version."""
    depth, first = 0, 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == FSTRING_START:
            depth, first = depth + 1, first if depth else tok.start[0]
        elif tok.type == FSTRING_END:
            depth -= 1
            if not depth:
                yield tokenize.STRING, "f-string", first, tok.end[0]
        elif not depth:
            yield tok.type, tok.string, tok.start[0], tok.end[0]


def text_counts(source: str) -> dict[str, int]:
    """Lines, code lines, prose lines, code tokens and prose words of ``source`` (see the module docstring)."""
    docs = docstring_lines(ast.parse(source))
    code_lines: set[int] = set()
    code_tokens = prose_words = 0
    for kind, string, first, last in tokens(source):
        if kind == tokenize.COMMENT:
            prose_words += len(string.lstrip("#").split())
        elif kind == tokenize.STRING and first in docs:
            prose_words += len(string.strip("\"'rbuRBU").split())
        elif kind not in LAYOUT:
            code_tokens += 1
            code_lines.update(range(first, last + 1))
    lines = source.splitlines()
    prose_lines = sum(1 for i, line in enumerate(lines, 1) if line.strip() and i not in code_lines)
    return {"lines": len(lines), "code_lines": len(code_lines), "prose_lines": prose_lines,
            "code_tokens": code_tokens, "prose_words": prose_words}


def project_classes(folders: list[Path]) -> dict[str, tuple[set[str], list[str]]]:
    """Class name -> (the attributes its source defines, its base class names), over every ``.py`` in ``folders``."""
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for path in sorted(p for folder in folders for p in folder.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            attrs = {a.id for s in node.body if isinstance(s, ast.Assign) for a in s.targets if isinstance(a, ast.Name)}
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    attrs.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    attrs.add(sub.target.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    attrs.add(sub.attr)
            old_attrs, old_bases = classes.get(node.name, (set(), []))
            classes[node.name] = (old_attrs | attrs, old_bases + [b.id for b in node.bases if isinstance(b, ast.Name)])
    return classes


class Typer:
    """Which project (or local) class a variable or expression of the file holds: flow-insensitive, by name."""

    def __init__(self, tree: ast.Module, imported: dict[str, str], classes: dict) -> None:
        self.imported, self.classes = imported, classes
        self.local = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.fields = {c: {s.target.id: s.annotation for s in n.body if isinstance(s, ast.AnnAssign)}
                       for c, n in self.local.items()}
        self.types: dict[str, str] = {}
        for _ in range(3):  # aliases of aliases
            for node in ast.walk(tree):
                if isinstance(node, ast.arg) and node.annotation is not None and self.annotated(node.annotation):
                    self.types[node.arg] = self.annotated(node.annotation)
                elif isinstance(node, ast.Assign):
                    pairs = [(target, node.value) for target in node.targets]
                    if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs = list(zip(node.targets[0].elts, node.value.elts))
                    for target, value in pairs:
                        if isinstance(target, ast.Name) and self.of(value):
                            self.types[target.id] = self.of(value)

    def project(self, name: str) -> str | None:
        """The class an imported or local name stands for, if it is one of the project's or the file's own."""
        real = self.imported.get(name)
        return real if real in self.classes else (name if name in self.local else None)

    def annotated(self, annotation: ast.expr) -> str | None:
        names = [n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)] + \
                [n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        return next((self.project(n) for n in names if self.project(n)), None)

    def of(self, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            if expr.id in self.local:
                return None  # the class itself, not one of its objects
            return self.types.get(expr.id) or self.project(expr.id)
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Name):
                return self.project(func.id)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                    and self.imported.get(func.value.id) in self.classes:
                return self.imported[func.value.id]  # a classmethod constructor
            return None
        if isinstance(expr, ast.IfExp):
            return self.of(expr.body) or self.of(expr.orelse)
        if isinstance(expr, ast.Attribute):
            owner = self.of(expr.value)
            if owner in self.fields and expr.attr in self.fields[owner]:
                return self.annotated(self.fields[owner][expr.attr])
        return None


def lookups(source: str, folders: list[Path], packages: tuple[str, ...]) -> tuple[set[str], set[tuple[str, str]]]:
    """The project names ``source`` imports, and the (project class, attribute) pairs it reads."""
    tree = ast.parse(source)
    classes = project_classes(folders)
    imported = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages
                for alias in node.names}
    typer = Typer(tree, imported, classes)

    def defined(cls: str, attr: str) -> bool:
        todo, seen = [cls], set()
        while todo:
            c = todo.pop()
            if c in classes and c not in seen:
                seen.add(c)
                if attr in classes[c][0]:
                    return True
                todo += classes[c][1]
        return False

    pairs = set()
    for node in (n for n in ast.walk(tree) if isinstance(n, ast.Attribute)):
        owner = typer.of(node.value)
        if owner in classes and owner not in typer.local and defined(owner, node.attr):
            pairs.add((owner, node.attr))
    return set(imported), pairs


def measure(path: Path, folders: list[Path], packages: tuple[str, ...]) -> dict:
    """Every count of the file at ``path``; ``_names`` and ``_pairs`` list its look-ups."""
    source = path.read_text(encoding="utf-8")
    names, pairs = lookups(source, folders, packages)
    return {**text_counts(source), "lookups": len(names) + len(pairs), "_names": sorted(names),
            "_pairs": sorted(pairs)}


def line_minutes(m: dict, ref: dict = REFERENCE) -> float:
    """The line basis: reading units (a prose line is half a code line) at the reference's pace."""
    units = lambda c: c["code_lines"] + PROSE_LINE_WEIGHT * c["prose_lines"]  # noqa: E731
    return units(m) * REFERENCE_MINUTES / units(ref)


def token_minutes(m: dict, ref: dict = REFERENCE, words_per_minute: float = WORDS_PER_MINUTE,
                  lookup_minutes: float = LOOKUP_MINUTES) -> float:
    """The token basis: code tokens at the rate that makes the reference read in ``REFERENCE_MINUTES``."""
    rest = lambda c: c["prose_words"] / words_per_minute + c["lookups"] * lookup_minutes  # noqa: E731
    tokens_per_minute = ref["code_tokens"] / (REFERENCE_MINUTES - rest(ref))
    return m["code_tokens"] / tokens_per_minute + rest(m)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", type=Path, default=TARGET)
    p.add_argument("--reference", type=Path, help="re-measure nanoGPT's train.py here instead of REFERENCE")
    p.add_argument("--show-lookups", action="store_true")
    p.add_argument("--sweep", action="store_true", help="the token basis under other prose and look-up weights")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    ref = measure(args.reference, [args.reference.parent], REFERENCE_PACKAGES) if args.reference else REFERENCE
    m = measure(args.target, [REPO / name for name in PACKAGES], PACKAGES)
    result = {"target": str(args.target), **{k: v for k, v in m.items() if not k.startswith("_")},
              "line_minutes": round(line_minutes(m, ref), 1), "token_minutes": round(token_minutes(m, ref), 1),
              "reference": {k: v for k, v in ref.items() if not k.startswith("_")}}
    if args.json:
        print(json.dumps(result))
        return result
    show = lambda c: ", ".join(f"{k} {c[k]}" for k in REFERENCE)  # noqa: E731
    print(f"reference (nanoGPT train.py, {REFERENCE_MINUTES:g} min): {show(ref)}")
    print(f"{args.target.name}: {show(m)}")
    print(f"line basis  (prose line = {PROSE_LINE_WEIGHT} code line, no look-up cost): {result['line_minutes']} min")
    print(f"token basis (prose {WORDS_PER_MINUTE:g} words/min, {LOOKUP_MINUTES} min a look-up): "
          f"{result['token_minutes']} min, of which look-ups {m['lookups'] * LOOKUP_MINUTES:.1f}")
    if args.sweep:
        for wpm in (150.0, 200.0, 250.0):
            row = [f"{token_minutes(m, ref, wpm, c):.1f}" for c in (0.0, 0.25, 0.5)]
            print(f"  token basis, prose {wpm:g} words/min; look-up 0 / 0.25 / 0.5 min: {' / '.join(row)} min")
    if args.show_lookups:
        print("imported:", ", ".join(m["_names"]))
        print("attributes:", ", ".join(f"{c}.{a}" for c, a in m["_pairs"]))
    return result


if __name__ == "__main__":
    main()
