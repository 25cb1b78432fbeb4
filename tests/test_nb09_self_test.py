"""09_self_test: no hint or check message gives a graded answer away; empty answers and near misses get their
messages; running the notebook does not answer the quiz before the learner has tried.

The contract of both exercise checks (solution passes, stub fails, hints give no line of an answer, every
distractor and wrong answer of tests/support/wrong_answers/nb09.py fails with its fragment) is in tests/test_exercise_contracts.py, its
50-seed sweep in tests/test_exercise_sweeps.py.
"""
from __future__ import annotations

import ast
import math
import re

import nbformat
import pytest

from course_tools.checks import CheckFailed
from course_tools.checks import nb09_self_test as checks
from course_tools.quiz import check
from tests.support.notebook_cells import ROOT, exercise_pairs, run_source, stub_hints
from tests.support.quiz_leaks import graded_hits, literals

NAME = "09_self_test.ipynb"


@pytest.fixture(scope="module")
def pairs():
    """(solution, stub) sources of each exercise; read when a test runs, so a broken notebook fails tests
    instead of breaking collection."""
    return exercise_pairs(NAME)


@pytest.fixture(scope="module")
def solved():
    return nbformat.read(ROOT / "solutions" / NAME, as_version=4)


CHECKS = [("self_test_answers", checks.check_self_test_answers),
          ("ema_start_weight", checks.check_ema_start_weight)]


def test_at_most_45_cells(solved):
    assert len(solved.cells) <= 45


def _solution_answers(pairs):
    return run_source(pairs[0][0])["self_test_answers"]()


def test_answers_check_rejects_missing_empty_and_non_dict(pairs):
    for qid, empty in (("q5", None), ("q2", ""), ("q3", "   "), ("q4", ...)):
        answers = _solution_answers(pairs)
        if empty is None:
            answers.pop(qid)
        else:
            answers[qid] = empty
        with pytest.raises(CheckFailed, match=f"未作答 {qid}"):
            checks.check_self_test_answers(lambda: answers)
    with pytest.raises(CheckFailed, match="dict"):
        checks.check_self_test_answers(lambda: ["B"] * 11)
    with pytest.raises(CheckFailed, match="dict"):
        checks.check_self_test_answers(lambda: None)   # forgot the return


def test_solution_answers_match_the_bank(pairs):
    answers = _solution_answers(pairs)
    assert set(answers) == set(checks.GRADED_IDS)
    assert all(check(checks.QUIZ.by_id[q], a).correct for q, a in answers.items())


def test_answer_exercise_returns_a_plain_literal(pairs):
    # The instructor grader reads the returned dict as a literal, outside the kernel.
    tree = ast.parse(pairs[0][0])
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "self_test_answers")
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Dict)
    assert ast.literal_eval(body[0].value) == _solution_answers(pairs)


# --- no hint and no message gives a graded answer away --------------------------------------------------------

def _stub_hints(pairs) -> list[str]:
    hints = [h for _, stub in pairs for h in stub_hints(stub)]
    assert len(hints) == len(pairs)
    return hints


def test_the_old_leaking_hint_would_be_caught():
    # the hint that scored 3/3 as it stood (issue 13, item 3)
    assert len(graded_hits('返回一个 dict,例如 {"q1": "B", "q4": "ACD", "q10": 0.82, ...}')) >= 3


def test_stub_hints_contain_no_graded_answer(pairs):
    for hint in _stub_hints(pairs):
        assert not graded_hits(hint), (hint, graded_hits(hint))


def test_the_functions_the_hints_suggest_do_not_pass(pairs):
    # a constant copied from a hint never passes a function exercise
    for hint, (name, check_fn) in zip(_stub_hints(pairs)[1:], CHECKS[1:]):
        for value in [v for v in literals(hint) if isinstance(v, float)]:
            with pytest.raises(CheckFailed):
                check_fn(lambda *args, v=value: v)


def test_check_messages_contain_no_graded_answer(pairs):
    solution = _solution_answers(pairs)
    attempts = [lambda: ["B"] * 11, lambda: {}, lambda: {q: "E" for q in checks.GRADED_IDS},
                lambda: dict(solution, q1="A", q10=0.8, q11=4.2)]
    for attempt in attempts:
        with pytest.raises(CheckFailed) as info:
            checks.check_self_test_answers(attempt)
        shown = f"{info.value.expected} {info.value.found} {info.value.hint}"
        assert not graded_hits(shown), (shown, graded_hits(shown))


# --- the other two exercises ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", [2e-6, -3e-6, 1e-4, 0.01])
def test_ema_near_miss_prints_the_digits_that_differ(rel):
    """A failure whose expected and found values print the same is a defect (issue 20, item 7)."""
    with pytest.raises(CheckFailed) as info:
        checks.check_ema_start_weight(lambda d, n: d ** n * (1 + rel))
    shown_want = info.value.expected.split("= ")[1].split("(")[0]
    assert shown_want != info.value.found, str(info.value)
    assert "1e-6" in info.value.expected


def test_ema_within_the_stated_tolerance_passes(capsys):
    checks.check_ema_start_weight(lambda d, n: d ** n * (1 + 0.5 * checks.EMA_REL_TOL))
    assert "✅" in capsys.readouterr().out


def test_ema_exercise_text_states_the_tolerance_and_the_cases(solved):
    text = next(c.source for c in solved.cells if c.cell_type == "markdown" and "ema_start_weight" in c.source
                and "## 练习 2" in c.source)
    assert f"{checks.EMA_REL_TOL:.0e}".replace("e-06", "e-6") in text
    assert "(0.999, 0)" in text and "(0.999, 3000)" in text and "6 组" in text


# --- running the notebook does not answer the quiz before the learner tries -----------------------------------

def _index(nb, cell_id):
    return next(i for i, c in enumerate(nb.cells) if c.id == cell_id)


def test_questions_come_before_the_graded_answers_and_experiments_after(solved):
    answers_check = _index(solved, "nb09-check-answers")
    code_before = [c for c in solved.cells[:answers_check] if c.cell_type == "code"]
    setup, rest = code_before[0], code_before[1:]
    assert "QUIZ" in setup.source and "show" not in setup.source
    shown = []
    for cell in rest:
        if "exercise" in cell.metadata.get("tags", []):
            continue
        calls = [ln.strip() for ln in cell.source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert all(re.fullmatch(r'QUIZ\.show\(\[("q\d+"(, )?)+\]\)', ln) for ln in calls), cell.source
        shown += re.findall(r'"(q\d+)"', cell.source)
    assert shown == [q.id for q in checks.QUIZ.questions]
    for cell in solved.cells[:answers_check]:
        assert "QUIZ.reveal(" not in cell.source or cell.cell_type == "markdown"
    # every graded question has its experiment, after the graded answers
    for k in (int(qid[1:]) for qid in checks.GRADED_IDS):
        where = [i for i, c in enumerate(solved.cells)
                 if c.cell_type == "markdown" and re.search(rf"### 实验 \d+\(第 ([\d、]*\b{k}\b[\d、]*) 题\)", c.source)]
        assert where and min(where) > answers_check, f"q{k}: no experiment after the graded answers"
    # nothing computed before the answers check: only question texts and answer bars are shown there
    for cell in solved.cells[:answers_check]:
        for out in cell.get("outputs", []):
            text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
            assert "->" not in text and "torch.float" not in text, text[:200]


def test_reopening_and_run_all_are_explained(solved):
    intro = solved.cells[0].source
    assert "model not found" in intro and "重新运行" in intro
    assert "Run All" in intro and "Run Selected Cell and All Below" in intro
    assert "还没做的练习不会挡住 Run All" in intro and "Run All 停在那里" in intro


def test_the_intro_announces_every_scored_part(solved):
    intro = solved.cells[0].source
    headings = re.findall(r"^## (练习 \d+)", "\n".join(c.source for c in solved.cells if c.cell_type == "markdown"),
                          re.M)
    assert headings == ["练习 1", "练习 2"]
    for heading in headings:
        assert f"**{heading}**" in intro, heading
    checked = [c for c in solved.cells if "check" in c.metadata.get("tags", [])]
    assert len(checked) == len(headings)


def test_experiments_are_one_short_cell_each(solved):
    """Each experiment: a markdown heading and at most one code cell of at most 30 lines."""
    heads = [i for i, c in enumerate(solved.cells) if c.cell_type == "markdown" and c.source.startswith("### 实验")]
    assert len(heads) == len(checks.GRADED_IDS)
    for i in heads:
        following = []
        for c in solved.cells[i + 1:]:
            if c.cell_type == "markdown":
                break
            following.append(c)
        assert len(following) <= 1, solved.cells[i].source[:40]
        assert all(len(c.source.splitlines()) <= 30 for c in following), solved.cells[i].source[:40]


def test_the_worker_speed_up_is_not_blamed_on_the_cores(solved):
    """The slow-disk delay is time.sleep latency: k workers give about k x whatever the core count."""
    text = "\n".join(c.source for c in solved.cells)
    assert "取决于 CPU 核数和机器上的其他进程" not in text
    q8 = next(c.source for c in solved.cells if c.source.startswith("### 实验 8"))
    assert "time.sleep" in q8 and "与 CPU 核数无关" in q8 and "06 §3" in q8
    assert not any("SlowDisk" in c.source for c in solved.cells if c.cell_type == "code")


def test_question_cells_print_the_question_text(solved):
    # the text stays in the saved notebook, so a reopened notebook still shows every question
    for q in checks.QUIZ.questions:
        cell = next(c for c in solved.cells if c.cell_type == "code" and c.source.startswith("QUIZ.show(")
                    and f'"{q.id}"' in c.source)
        printed = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert f"[{q.id}] {q.prompt}" in printed, printed[:120]


def test_ema_warmup_decays_shown_are_the_ones_used(solved):
    from course_utils.ema import EMA
    from torch import nn
    cell = next(c for c in solved.cells if c.cell_type == "code" and "warmup=True" in c.source)
    shown = re.search(r"use decays \[([^\]]*)\]", "".join(o.get("text", "") for o in cell.outputs)).group(1)
    model = nn.Linear(1, 1)
    ema = EMA(model, decay=0.999, warmup=True)
    used = []
    for update in range(5):
        if update > 0:           # the first update copies the weights: no decay is used
            used.append(round(ema.current_decay(), 3))
        ema.update(model)
    assert [float(v) for v in shown.split(",")] == used
    assert not math.isclose(used[0], 0.1)
