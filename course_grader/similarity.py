"""The similarity report of the homework scripts: pairs a person should look at, never a verdict.

A script becomes shingle hashes (:func:`fingerprint`): its tokens without comments, layout, docstrings or trailing
commas; strings ``S``, numbers ``N``, names ``V`` (keywords, operators and attribute names, the library's API,
kept); every run of :data:`K` tokens hashed, minus the shingles of the released baseline. The score,
``shared / max(min(len(a), len(b)), MIN_PRINTS)``, stays high for a copy that adds code; the floor keeps a barely
changed baseline from scoring 1.0. Pairs at or above :data:`THRESHOLD` are flagged, shown with the lines they
share (:func:`matched_blocks`).

:data:`THRESHOLD` was measured on ``tests/fixtures/similarity/`` (four independent implementations, four disguised
copies): with K = 12 unrelated pairs score 0.009-0.17, disguised copies 0.81-1.0 (K = 8: 0.31 and 0.86, K = 20:
0.15 and 0.74; ``pytest -n 0 -s tests/test_grade_similarity.py -k measured``): 0.5 leaves ~0.3 on either side.

Example::

    rows = pair_rows({"alice": {"train_cifar.py": a}, "bob": {"train_cifar.py": b}},
                     references={REFERENCE: {"train_cifar.py": ref}}, baseline={"train_cifar.py": base})
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import io
import itertools
import keyword
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from course_grader.report import safe_field, write_rows

__all__ = ["Block", "matched_blocks", "K", "MIN_PRINTS", "THRESHOLD", "OVERALL", "REFERENCE", "PRO_REFERENCE",
           "SIMILARITY_COLUMNS", "Fingerprint", "SimilarityRow", "tokens", "fingerprint", "similarity", "pair_rows",
           "ranked", "write_csv", "summary"]

K = 12              # tokens per shingle
MIN_PRINTS = 20     # the score's denominator is at least this many shingles
THRESHOLD = 0.5     # flag pairs at or above (measured: see the module docstring)
OVERALL = "(全部脚本)"   # the script column of a learner pair's row over all their scripts together
REFERENCE = "solutions/homework"   # the other name of a row against the reference answer (the learner's scale)
PRO_REFERENCE = "solutions/homework/train_cifar_pro.py"   # ... and of a row against the professional script
SIMILARITY_COLUMNS = ("learner", "other", "script", "score", "shared", "prints", "other_prints", "flagged", "note")

_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENCODING,
           tokenize.ENDMARKER}
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)     # Python 3.12+: f-strings are token sequences
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)
_CLOSING = {")", "]", "}"}
_FALLBACK = re.compile(r"""(?P<string>[rbuf]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
    |(?P<comment>\#[^\n]*)|(?P<newline>\n)|(?P<name>[^\W\d]\w*)|(?P<number>\d[\w.]*)|(?P<space>[ \t\f\r\\]+)
    |(?P<op>\*\*=?|//=?|>>=?|<<=?|->|:=|[-+*/%&|^@=!<>]=|.)""", re.VERBOSE | re.IGNORECASE)


@dataclass(frozen=True)
class Fingerprint:
    """A script's shingle hashes (baseline shingles removed), and whether tokenize failed on it."""

    prints: frozenset[int]
    degraded: bool = False


@dataclass(frozen=True)
class SimilarityRow:
    """One compared pair for one script (or :data:`OVERALL`); ``other`` is a learner or a reference's name."""

    learner: str
    other: str
    script: str
    score: float
    shared: int
    prints: int
    other_prints: int
    note: str = ""

    @property
    def flagged(self) -> bool:
        return self.score >= THRESHOLD

    def row(self) -> dict[str, str]:
        return {"learner": safe_field(self.learner, 400), "other": safe_field(self.other, 400),
                "script": safe_field(self.script, 200), "score": f"{self.score:.3f}", "shared": str(self.shared),
                "prints": str(self.prints), "other_prints": str(self.other_prints),
                "flagged": "1" if self.flagged else "0", "note": safe_field(self.note, 400)}


def _raw_tokens(source: str) -> tuple[list[tuple[str, str]], bool]:
    """``(kind, text)`` pairs with kind in ``string, name, number, op, newline``; ``True`` when tokenize failed."""
    out: list[tuple[str, str]] = []
    try:
        depth = 0
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == _FSTRING_START:
                depth += 1
                if depth == 1:
                    out.append(("string", "S"))
            elif tok.type == _FSTRING_END:
                depth -= 1
            elif depth:
                continue
            elif tok.type == tokenize.NEWLINE:
                out.append(("newline", ""))
            elif tok.type in _LAYOUT or tok.type == tokenize.ERRORTOKEN and not tok.string.strip():
                continue
            else:
                kind = {tokenize.STRING: "string", tokenize.NAME: "name", tokenize.NUMBER: "number"}.get(tok.type, "op")
                out.append((kind, tok.string))
        return out, False
    except (tokenize.TokenError, SyntaxError):
        return [(m.lastgroup, m.group()) for m in _FALLBACK.finditer(source)
                if m.lastgroup not in ("comment", "space")], True


def tokens(source: str) -> tuple[list[str], bool]:
    """The normalised token stream of ``source`` (see the module docstring) and whether tokenize failed on it."""
    raw, degraded = _raw_tokens(source)
    result: list[str] = []
    statement_start = True
    for i, (kind, text) in enumerate(raw):
        if kind == "newline":
            statement_start = True
            continue
        if kind == "string":
            if statement_start:     # a string alone as a statement (docstring): skip it
                j = i
                while j < len(raw) and raw[j][0] == "string":
                    j += 1
                if j == len(raw) or raw[j][0] == "newline":
                    continue
            statement_start = False
            if not (result and result[-1] == "S"):
                result.append("S")
            continue
        statement_start = False
        if kind == "number":
            result.append("N")
        elif kind == "name":
            after_dot = bool(result) and result[-1] == "."
            result.append(text if after_dot or keyword.iskeyword(text) else "V")
        elif text in _CLOSING and result and result[-1] == ",":
            result[-1] = text
        else:
            result.append(text)
    return result, degraded


def _shingles(stream: list[str]) -> set[int]:
    return {int.from_bytes(hashlib.blake2b("\x1f".join(stream[i:i + K]).encode(), digest_size=8).digest(), "big")
            for i in range(len(stream) - K + 1)}


@functools.lru_cache(maxsize=8)
def _baseline_shingles(baseline: str) -> frozenset[int]:
    return frozenset(_shingles(tokens(baseline)[0]))


def fingerprint(source: str, baseline: str = "") -> Fingerprint:
    """The shingles of ``source`` that ``baseline`` does not have."""
    stream, degraded = tokens(source)
    return Fingerprint(frozenset(_shingles(stream) - _baseline_shingles(baseline)), degraded)


def _score(a: frozenset[int], b: frozenset[int]) -> tuple[float, int]:
    shared = len(a & b)
    return shared / max(min(len(a), len(b)), MIN_PRINTS), shared


def similarity(a: str, b: str, baseline: str = "") -> float:
    """How much of the smaller script's own code (baseline removed) the other contains, 0.0 to 1.0."""
    return _score(fingerprint(a, baseline).prints, fingerprint(b, baseline).prints)[0]


def _row(learner: str, other: str, script: str, a: Fingerprint, b: Fingerprint) -> SimilarityRow:
    score, shared = _score(a.prints, b.prints)
    note = "无法解析, 按粗略分词比较" if a.degraded or b.degraded else ""
    return SimilarityRow(learner, other, script, round(score, 3), shared, len(a.prints), len(b.prints), note)


def pair_rows(learners: dict[str, dict[str, str]], references: dict[str, dict[str, str]],
              baseline: dict[str, str]) -> list[SimilarityRow]:
    """Every pair of learners, and each learner against each reference, per script and :data:`OVERALL`.
    ``learners``: learner -> file -> source; ``references``: name -> the LEARNER's file name -> source compared with
    it; ``baseline``: file -> the released script. A script one side lacks counts in the overall row only."""
    def both(sources: dict[str, str]) -> tuple[dict[str, Fingerprint], Fingerprint]:   # per script, overall
        p = {script: fingerprint(source, baseline.get(script, "")) for script, source in sources.items()}
        return p, Fingerprint(frozenset().union(*(f.prints for f in p.values())), any(f.degraded for f in p.values()))

    prints = {name: both(scripts) for name, scripts in learners.items()}
    pairs = [(a, b, prints[a], prints[b]) for a, b in itertools.combinations(sorted(prints), 2)]
    refs = [(other, both(sources)) for other, sources in references.items() if sources]
    pairs += [(name, other, prints[name], ref) for other, ref in refs for name in sorted(prints)]
    rows: list[SimilarityRow] = []
    for first, second, (a, a_all), (b, b_all) in pairs:
        rows += [_row(first, second, script, a[script], b[script]) for script in sorted(a.keys() & b.keys())]
        rows.append(_row(first, second, OVERALL, a_all, b_all))
    return rows


def ranked(rows: list[SimilarityRow]) -> list[SimilarityRow]:
    return sorted(rows, key=lambda r: (-r.score, r.learner, r.other, r.script))


def write_csv(path: Path, rows: list[SimilarityRow]) -> Path:
    """``rows`` as CSV (:data:`SIMILARITY_COLUMNS`), highest score first; every text field spreadsheet-safe."""
    write_rows(path, SIMILARITY_COLUMNS, (row.row() for row in ranked(rows)))
    return path


def summary(rows: list[SimilarityRow], limit: int = 20) -> str:
    """The terminal summary: how many pairs were compared and the flagged ones, for a person to look at."""
    pairs = {(r.learner, r.other) for r in rows}
    flagged = [r for r in ranked(rows) if r.flagged]
    head = f"相似度: 比较了 {len(pairs)} 对, {len(flagged)} 行达到阈值 {THRESHOLD:.2f} (只供人工查看, 不自动判零)"
    lines = [head] + [f"  {safe_field(r.learner, 80)} ~ {safe_field(r.other, 80)}  {safe_field(r.script, 80)}  "
                      f"{r.score:.2f} (共享 {r.shared} / {min(r.prints, r.other_prints)} 段)"
                      + (f"  {r.note}" if r.note else "") for r in flagged[:limit]]
    if len(flagged) > limit:
        lines.append(f"  …… 另有 {len(flagged) - limit} 行, 见 grades.similarity.csv")
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    """One run of matching lines: (first line number, the lines as written) on each side."""

    left: tuple[int, list[str]]
    right: tuple[int, list[str]]


def _normalised(source: str, skip: frozenset[str]) -> list[tuple[int, str]]:
    """(line index, normalised text) of the lines that carry code of the learner's own."""
    lines = ((index, " ".join(tokens(line.strip())[0])) for index, line in enumerate(source.splitlines()))
    return [(index, text) for index, text in lines if text and text not in skip]


def matched_blocks(a: str, b: str, baseline: str = "", min_lines: int = 3, limit: int = 6) -> list[Block]:
    """The longest runs (at least ``min_lines`` normalised lines) that ``a`` and ``b`` share, longest first."""
    skip = frozenset(text for _, text in _normalised(baseline, frozenset()))
    left, right = _normalised(a, skip), _normalised(b, skip)
    matcher = difflib.SequenceMatcher(None, [t for _, t in left], [t for _, t in right], autojunk=False)
    runs = sorted((m for m in matcher.get_matching_blocks() if m.size >= min_lines), key=lambda m: -m.size)
    lines_a, lines_b = a.splitlines(), b.splitlines()
    blocks = []
    for m in runs[:limit]:
        a0, a1 = left[m.a][0], left[m.a + m.size - 1][0]
        b0, b1 = right[m.b][0], right[m.b + m.size - 1][0]
        blocks.append(Block((a0 + 1, lines_a[a0:a1 + 1]), (b0 + 1, lines_b[b0:b1 + 1])))
    return blocks
