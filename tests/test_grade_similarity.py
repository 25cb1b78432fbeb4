"""course_grader.similarity: disguised copies flagged, independent work and untouched baselines not.

The fixtures (tests/fixtures/similarity/) are four independent implementations of one upgrade of
the baseline and four disguised copies of them; the reference answer (solutions/homework/train_cifar.py, the
baseline plus the patches in solutions/homework/upgrades/) and the professional script (train_cifar_pro.py)
are a second, real-size independent pair, and the two references every learner is compared with.
"""
from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path

import pytest

from course_grader.similarity import (OVERALL, PRO_REFERENCE, REFERENCE, SIMILARITY_COLUMNS, THRESHOLD,
                                           fingerprint, pair_rows, similarity, summary, tokens, write_csv)
from tests.support.homework_scripts import BASELINE, TRAIN
from tests.support.notebook_cells import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "similarity"
SCRIPTS = {p.stem: p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.py"))}
INDEPENDENT = [name for name in SCRIPTS if name.startswith("independent_")]
COPIES = {name: "independent_" + name.split("_")[2] for name in SCRIPTS if name.startswith("copy_of_")}
BASE = BASELINE.read_text(encoding="utf-8")
ANSWER = (ROOT / "solutions" / "homework" / TRAIN).read_text(encoding="utf-8")  # the reference answer
PRO = (ROOT / "solutions" / "homework" / "train_cifar_pro.py").read_text(encoding="utf-8")
REFERENCES = {REFERENCE: {TRAIN: ANSWER}, PRO_REFERENCE: {TRAIN: PRO}}
MARGIN = 0.2


def test_fixtures_are_what_the_measurement_needs() -> None:
    assert len(INDEPENDENT) >= 4 and len(COPIES) >= 4 and set(COPIES.values()) <= set(INDEPENDENT)
    for name in COPIES:     # a disguised copy is not a literal one
        assert SCRIPTS[name] != SCRIPTS[COPIES[name]]


def test_measured_threshold_separates_copies_from_independent_work() -> None:
    unrelated = {f"{a} ~ {b}": similarity(SCRIPTS[a], SCRIPTS[b], BASE) for a, b in itertools.combinations(INDEPENDENT, 2)}
    unrelated |= {f"{c} ~ {i}": similarity(SCRIPTS[c], SCRIPTS[i], BASE)
                  for c in COPIES for i in INDEPENDENT if i != COPIES[c]}
    unrelated |= {f"{ref} ~ {i}": similarity(text, SCRIPTS[i], BASE)
                  for ref, text in (("train_cifar.py", ANSWER), ("train_cifar_pro.py", PRO)) for i in INDEPENDENT}
    unrelated["train_cifar.py ~ train_cifar_pro.py"] = similarity(ANSWER, PRO, BASE)
    copies = {f"{c} ~ {o}": similarity(SCRIPTS[c], SCRIPTS[o], BASE) for c, o in COPIES.items()}
    for label, score in sorted(unrelated.items()) + sorted(copies.items()):
        print(f"{score:.3f}  {label}")
    print(f"unrelated max {max(unrelated.values()):.3f}, copies min {min(copies.values()):.3f}, threshold {THRESHOLD}")
    assert max(unrelated.values()) + MARGIN <= THRESHOLD <= min(copies.values()) - MARGIN


def test_normalisation_ignores_names_strings_numbers_comments_and_layout() -> None:
    a = 'def f(x, y=1):\n    """doc"""\n    # note\n    return g(x, "s", 2) + y.clip_grad_norm_(x)\n'
    b = "def other(p, q=7):\n    'changed docstring'\n    return h(\n        p, f'{q} text', 3.5,\n    ) + q.clip_grad_norm_(p)  # c\n"
    assert tokens(a) == tokens(b)
    stream, degraded = tokens(a)
    assert not degraded and "clip_grad_norm_" in stream and "def" in stream and "return" in stream
    assert "f" not in stream and "x" not in stream and "S" in stream and "N" in stream
    assert tokens("x.step()\n")[0] != tokens("x.zero_grad()\n")[0]       # attribute names are kept


def test_untouched_baselines_score_zero_and_are_not_flagged() -> None:
    recommented = re.sub(r"#.*", "", BASE).replace("chapter 0.2", "mine")
    assert fingerprint(BASE, BASE).prints == frozenset()
    assert similarity(BASE, BASE, BASE) == 0.0
    assert similarity(recommented, BASE, BASE) == 0.0
    assert similarity(BASE, ANSWER, BASE) == similarity(BASE, PRO, BASE) == 0.0
    assert similarity(BASE, BASE) == 1.0, "without the baseline removed, the two would be identical"
    rows = pair_rows({"a": {TRAIN: BASE}, "b": {TRAIN: recommented}}, {}, {TRAIN: BASE})
    assert [r.score for r in rows] == [0.0, 0.0] and not any(r.flagged for r in rows)


@pytest.mark.parametrize("copied, other", [(ANSWER, REFERENCE), (PRO, PRO_REFERENCE)], ids=["answer", "pro"])
def test_a_copy_of_either_reference_is_flagged_against_it(copied: str, other: str) -> None:
    # comments gone and every name `step` renamed, attributes (optimizer.step) included: only those shingles change
    renamed = re.sub(r"\bstep\b", "n_step", re.sub(r"#.*", "", copied))
    rows = pair_rows({"copier": {TRAIN: renamed}, "honest": {TRAIN: SCRIPTS["independent_2"]}}, REFERENCES,
                     {TRAIN: BASE})
    against = {(r.learner, r.other, r.script): r for r in rows if r.other in REFERENCES}
    assert against["copier", other, TRAIN].score > 0.9 and against["copier", other, TRAIN].flagged
    assert not [key for key, r in against.items() if r.flagged and key[0] == "honest"]


def test_pair_rows_cover_every_pair_per_script_and_overall() -> None:
    learners = {"c": {TRAIN: SCRIPTS["independent_3"], "debug_overfit.py": SCRIPTS["independent_2"]},
                "a": {TRAIN: SCRIPTS["independent_1"]},
                "b": {TRAIN: SCRIPTS["copy_of_1_renamed"], "debug_overfit.py": SCRIPTS["copy_of_2_extracted"]}}
    rows = pair_rows(learners, REFERENCES, {TRAIN: BASE})
    keys = [(r.learner, r.other, r.script) for r in rows]
    assert keys == [("a", "b", TRAIN), ("a", "b", OVERALL), ("a", "c", TRAIN), ("a", "c", OVERALL),
                    ("b", "c", "debug_overfit.py"), ("b", "c", TRAIN), ("b", "c", OVERALL),
                    ("a", REFERENCE, TRAIN), ("a", REFERENCE, OVERALL), ("b", REFERENCE, TRAIN),
                    ("b", REFERENCE, OVERALL), ("c", REFERENCE, TRAIN), ("c", REFERENCE, OVERALL),
                    ("a", PRO_REFERENCE, TRAIN), ("a", PRO_REFERENCE, OVERALL), ("b", PRO_REFERENCE, TRAIN),
                    ("b", PRO_REFERENCE, OVERALL), ("c", PRO_REFERENCE, TRAIN), ("c", PRO_REFERENCE, OVERALL)]
    flagged = {(r.learner, r.other, r.script) for r in rows if r.flagged}
    # b copied half its work from c: over both scripts, more than half of b's own code is in c's
    assert flagged == {("a", "b", TRAIN), ("a", "b", OVERALL), ("b", "c", "debug_overfit.py"), ("b", "c", OVERALL)}
    # a file with no baseline (debug_overfit.py) is compared whole
    assert fingerprint(SCRIPTS["independent_2"]).prints == fingerprint(SCRIPTS["independent_2"], "").prints


def test_csv_is_injection_safe_and_sorted(tmp_path: Path) -> None:
    learners = {"=HYPERLINK(\"http://x\")": {"+cmd.py": SCRIPTS["independent_1"]},
                "@sum(A1)": {"+cmd.py": SCRIPTS["copy_of_1_renamed"]}, "-2+3": {"+cmd.py": BASE}}
    path = write_csv(tmp_path / "grades.similarity.csv", pair_rows(learners, {}, {"+cmd.py": BASE}))
    with open(path, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == SIMILARITY_COLUMNS
    for row in table[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row
    scores = [float(row[3]) for row in table[1:]]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and table[1][7] == "1"


def test_unparseable_python_degrades_gracefully() -> None:
    broken = SCRIPTS["independent_1"].replace("def main():", "def main(:\n  \tx = (", 1) + "\n  oops = [\n"
    stream, degraded = tokens(broken)
    assert degraded and "clip_grad_norm_" in stream and "V" in stream
    assert similarity(broken, SCRIPTS["independent_1"], BASE) >= THRESHOLD
    assert similarity(broken, SCRIPTS["independent_4"], BASE) < THRESHOLD
    rows = pair_rows({"a": {TRAIN: broken}, "b": {TRAIN: SCRIPTS["independent_1"]}}, {}, {TRAIN: BASE})
    assert rows[0].flagged and "无法解析" in rows[0].note
    assert tokens("")[0] == [] and similarity("", "", "") == 0.0
    assert tokens("\x00\ufeff'''unterminated")[1]


def test_summary_lists_flagged_pairs_for_a_person() -> None:
    learners = {"alice": {TRAIN: SCRIPTS["independent_1"]}, "bob": {TRAIN: SCRIPTS["copy_of_1_reformatted"]},
                "carol": {TRAIN: SCRIPTS["independent_4"]}}
    text = summary(pair_rows(learners, {}, {TRAIN: BASE}))
    lines = text.splitlines()
    assert "比较了 3 对" in lines[0] and "2 行达到阈值" in lines[0] and "人工" in lines[0] and "不自动判零" in lines[0]
    assert len(lines) == 3 and all("alice ~ bob" in line for line in lines[1:])
    assert "carol" not in text
