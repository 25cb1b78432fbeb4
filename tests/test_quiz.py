"""course_tools.quiz: judging answers, the plain-text route and the widgets (buttons clicked in code)."""
from __future__ import annotations

import pytest

from course_tools.quiz import Question, Quiz, check


def _quiz():
    return Quiz([
        Question("a", "single?", choices={"A": "x", "B": "y"}, answer="B", explanation="因为 y。"),
        Question("b", "multi?", kind="multi", choices={"A": "x", "B": "y", "C": "z"}, answer="AC"),
        Question("c", "number?", kind="number", answer=16.67, tolerance=0.02),
        Question("d", "text?", kind="text", keywords=(("优化器", "optimizer"), ("随机", "rng"))),
    ], name="QUIZ")


def test_check_each_kind():
    q = _quiz().by_id
    assert check(q["a"], "b").correct and not check(q["a"], "A").correct
    assert check(q["b"], "c, a").correct and check(q["b"], ["A", "C"]).correct
    assert "漏" in check(q["b"], "A").message and "选错" in check(q["b"], "AB").message
    assert check(q["c"], "16.7").correct and not check(q["c"], 4.2).correct
    assert "数字" in check(q["c"], "abc").message
    assert check(q["d"], "存 optimizer 和 RNG 状态").correct and not check(q["d"], "存模型").correct
    assert check(q["a"], None).message == "还没有作答"
    assert "没有选项" in check(q["a"], "Z").message


def test_feedback_never_reveals_the_answer():
    q = _quiz().by_id["a"]
    assert "B" not in check(q, "A").message and "y" not in check(q, "A").message


def test_bad_questions_are_rejected():
    with pytest.raises(ValueError):
        Question("x", "?", choices={"A": "1"}, answer="B")
    with pytest.raises(ValueError):
        Question("x", "?", choices={"A": "1", "B": "2"}, answer="AB")
    with pytest.raises(ValueError):
        Question("x", "?", kind="text")
    with pytest.raises(ValueError):
        Quiz([Question("x", "?", kind="number", answer=1)] * 2)


def test_grade_text_and_reveal(capsys):
    quiz = _quiz()
    results = quiz.grade({"a": "B", "b": "A", "zz": 1})
    out = capsys.readouterr().out
    assert results["a"].correct and not results["b"].correct
    assert "得分 1/3(未作答 1 题)(简答题不计分)" in out and "zz" in out   # d is a short answer: feedback only
    assert "QUIZ.grade" in quiz.text() and "[c]" in quiz.text("c")
    assert "因为 y" in quiz.reveal("a")


def test_widgets_check_and_reveal_buttons():
    quiz = _quiz()
    box = quiz.question_widget(quiz.by_id["b"], 2)
    parts = box._quiz_parts
    parts["check"].click()
    assert "还没有作答" in parts["feedback"].value
    boxes = parts["entry"].children
    boxes[0].value, boxes[2].value = True, True
    parts["check"].click()
    assert "✅" in parts["feedback"].value
    parts["reveal"].click()
    assert "AC" in parts["feedback"].value

    single = quiz.question_widget(quiz.by_id["a"])._quiz_parts
    single["entry"].value = "A"
    single["check"].click()
    assert "❌" in single["feedback"].value
    number = quiz.question_widget(quiz.by_id["c"])._quiz_parts
    number["entry"].value = "16.6"
    number["check"].click()
    assert "✅" in number["feedback"].value


def test_show_bundle_has_widget_and_text_fallback():
    from course_tools.quiz import _WithTextFallback

    quiz = _quiz()
    bundle = _WithTextFallback(quiz.question_widget(quiz.by_id["a"], 1), quiz.text("a"))._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("[a] single?")


def test_show_prints_each_question_then_its_answer_bar(capsys):
    # Outside a notebook display() prints the bar's text fallback; in Jupyter the printed question
    # text is ordinary output, so it stays in the saved notebook when the widget state does not.
    quiz = _quiz()
    quiz.show(["a", "b"])
    out = capsys.readouterr().out
    first, second = out.index("[a] single?"), out.index("[b] multi?")
    assert first < out.index("作答栏") < second
    assert out.count("作答栏") == 2 and "QUIZ.grade" in out


def test_compact_answer_bar_has_no_prompt_and_letters_only():
    quiz = _quiz()
    single = quiz.question_widget(quiz.by_id["a"], 1, compact=True)
    parts = single._quiz_parts
    assert len(single.children) == 3                                   # entry, buttons, feedback: no prompt
    assert list(parts["entry"].options) == [("A", "A"), ("B", "B")]
    parts["entry"].value = "B"
    parts["check"].click()
    assert "✅" in parts["feedback"].value
    multi = quiz.question_widget(quiz.by_id["b"], 2, compact=True)._quiz_parts
    assert [b.description for b in multi["entry"].children] == ["A", "B", "C"]
    multi["entry"].children[0].value = True
    multi["check"].click()
    assert "漏" in multi["feedback"].value
    multi["reveal"].click()
    assert "AC" in multi["feedback"].value
