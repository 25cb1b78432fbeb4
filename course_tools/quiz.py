"""Self-test quizzes: ipywidgets where they render, plain text everywhere else.

A :class:`Question` is single choice, multiple choice, a number (relative tolerance) or a short text answer
(keyword groups: every group needs one hit). ``quiz.show()`` prints each question's text (so it stays in the saved
notebook: GitHub, nbconvert, a console) with an answer bar under it; ``quiz.text()`` is the plain text;
``quiz.grade(answers)`` grades a dict written in a code cell without giving the answers away (``quiz.reveal("q3")``
does). Each verdict goes into the learner's ledger, keyed by the quiz's title. Pitfall: widget state is not saved
in the notebook, so anything graded automatically (nbval, the grader) goes through code cells, never the widgets;
a reopened notebook shows "Error displaying widget: model not found" where an answer bar was, under the question's
text: running the cell again brings the bar back (say so to learners). Example::

    quiz = Quiz([Question("q1", "bf16 有几位指数?", kind="number", answer=8, explanation="同 fp32")])
    quiz.show()
    quiz.grade({"q1": 8})
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["KINDS", "Question", "Feedback", "check", "question_text", "Quiz"]


KINDS = ("single", "multi", "number", "text")


@dataclass
class Question:
    """One question. ``answer``: a letter (single), letters (multi), a float (number); unused for text."""

    id: str
    prompt: str
    kind: str = "single"
    choices: dict[str, str] = field(default_factory=dict)
    answer: Any = None
    explanation: str = ""
    keywords: tuple[tuple[str, ...], ...] = ()
    tolerance: float = 0.02
    experiment: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind 只能是 {KINDS},实际是 {self.kind!r}")
        if self.kind in ("single", "multi"):
            letters = _letters(self.answer)
            if not letters or not letters <= set(self.choices):
                raise ValueError(f"{self.id}: 答案 {self.answer!r} 不在选项 {sorted(self.choices)} 中")
            if self.kind == "single" and len(letters) != 1:
                raise ValueError(f"{self.id}: 单选题只能有一个答案")
        if self.kind == "text" and not self.keywords:
            raise ValueError(f"{self.id}: 简答题需要 keywords")


@dataclass
class Feedback:
    correct: bool
    message: str


def _letters(value: Any) -> set[str]:
    """'AC', 'a, c', ['A', 'C'] -> {'A', 'C'}."""
    if value is None:
        return set()
    if isinstance(value, str):
        return {ch.upper() for ch in value if ch.isalpha()}
    if not isinstance(value, (list, tuple, set, frozenset)):
        return {str(value).strip().upper()}   # a number for a letter question: an unknown option, not a crash
    return {str(v).strip().upper() for v in value if str(v).strip()}


def check(question: Question, response: Any) -> Feedback:
    """Judge one response; the message never contains the reference answer."""
    if response is None or (isinstance(response, str) and not response.strip()) or response == []:
        return Feedback(False, "还没有作答")
    if question.kind in ("single", "multi"):
        got, want = _letters(response), _letters(question.answer)
        unknown = got - set(question.choices)
        if unknown:
            return Feedback(False, f"没有选项 {''.join(sorted(unknown))}")
        if got == want:
            return Feedback(True, "正确")
        if question.kind == "single" and len(got) > 1:
            return Feedback(False, "这是单选题,只选一个")
        if question.kind == "multi" and got < want:
            return Feedback(False, "部分正确: 还漏了选项")
        if question.kind == "multi" and got & want:
            return Feedback(False, "部分正确: 有选错的选项")
        return Feedback(False, "不对,再想想(可以先跑下面的实验)")
    if question.kind == "number":
        try:
            value = float(str(response).replace(",", "").strip())
        except ValueError:
            return Feedback(False, f"需要一个数字,实际是 {response!r}")
        want = float(question.answer)
        if math.isclose(value, want, rel_tol=question.tolerance, abs_tol=1e-12):
            return Feedback(True, "正确")
        hint = "偏大" if value > want else "偏小"
        return Feedback(False, f"{hint}(允许相对误差 {question.tolerance:.0%})")
    text = str(response).lower()
    missing = [group for group in question.keywords if not any(k.lower() in text for k in group)]
    if not missing:
        return Feedback(True, "要点齐全")
    return Feedback(False, f"还缺 {len(missing)} 个要点(共 {len(question.keywords)} 个)")


def question_text(q: Question, number: int | None = None) -> str:
    head = f"[{q.id}] " + (f"{number}. " if number is not None else "") + q.prompt
    lines = [head]
    lines += [f"    {k}. {v}" for k, v in q.choices.items()]
    how = {"single": "填一个字母", "multi": "填所有正确的字母,如 \"AC\"", "number": "填一个数字",
           "text": "用一两句话回答"}[q.kind]
    lines.append(f"    ({how})")
    return "\n".join(lines)


class Quiz:
    """A list of questions with widget, text and dict-grading front ends."""

    def __init__(self, questions: Iterable[Question], title: str = "自测题", name: str = "quiz") -> None:
        self.questions = list(questions)
        self.title = title
        self.name = name  # the variable name used in the printed instructions
        ids = [q.id for q in self.questions]
        if len(set(ids)) != len(ids):
            raise ValueError("题号重复")
        self.by_id = {q.id: q for q in self.questions}
        self.scored = [q.id for q in self.questions if q.kind != "text"]  # a short answer is feedback, not a mark

    def select(self, ids: Iterable[str] | str | None = None) -> list[Question]:
        if ids is None:
            return self.questions
        if isinstance(ids, str):
            ids = [ids]
        return [self.by_id[i] for i in ids]

    # -- plain text -------------------------------------------------------------
    def text(self, ids: Iterable[str] | str | None = None) -> str:
        qs = self.select(ids)
        body = "\n\n".join(question_text(q) for q in qs)
        template = "answers = {" + ", ".join(f'"{q.id}": ...' for q in qs) + "}"
        if len(qs) == 1:
            return (f"{body}\n纯文本作答: {self.name}.grade({{\"{qs[0].id}\": ...}});"
                    f"参考答案: {self.name}.reveal(\"{qs[0].id}\")")
        return (f"{self.title}\n\n{body}\n\n纯文本作答: 在代码格子里写\n    {template}\n"
                f"    {self.name}.grade(answers)\n参考答案: {self.name}.reveal(\"{qs[0].id}\")")

    def grade(self, answers: dict[str, Any], verbose: bool = True) -> dict[str, Feedback]:
        """Grade ``{id: answer}``; unknown ids are reported, missing ones count as unanswered."""
        unknown = sorted(set(answers) - set(self.by_id))
        results = {q.id: check(q, answers.get(q.id)) for q in self.questions if q.id in answers}
        self._record({qid: fb.correct for qid, fb in results.items()})
        if verbose:
            for qid, fb in results.items():
                print(f"{'✅' if fb.correct else '❌'} {qid}: {fb.message}")
            if unknown:
                print(f"⚠️ 没有这些题号: {', '.join(unknown)}")
            right = sum(results[qid].correct for qid in self.scored if qid in results)
            unanswered = sum(qid not in results for qid in self.scored)
            print(f"得分 {right}/{len(self.scored)}" + (f"(未作答 {unanswered} 题)" if unanswered else "")
                  + ("(简答题不计分)" if len(self.scored) < len(self.questions) else ""))
        return results

    def _record(self, verdicts: dict[str, bool]) -> None:
        """The scored questions' verdicts into the learner's ledger (a short answer is not a mark)."""
        from course_tools.ledger import record_quiz

        scored = {qid: ok for qid, ok in verdicts.items() if qid in self.scored}
        if scored:
            record_quiz(self.title, scored, len(self.scored))

    def reveal_text(self, qid: str) -> str:
        """The reference answer of one question, with its explanation and experiment."""
        q = self.by_id[qid]
        answer = {"single": lambda: f"答案 {q.answer}。", "multi": lambda: f"答案 {''.join(sorted(_letters(q.answer)))}。",
                  "number": lambda: f"答案 ≈ {q.answer:g}。", "text": lambda: ""}[q.kind]()
        return f"[{qid}] {answer}{q.explanation}" + (f"\n    动手验证: {q.experiment}" if q.experiment else "")

    def reveal(self, qid: str) -> str:
        """Print (and return) the reference answer of one question."""
        text = self.reveal_text(qid)
        print(text)
        return text

    # -- widgets ----------------------------------------------------------------
    def question_widget(self, q: Question, number: int | None = None, compact: bool = False):
        """One question as a VBox: prompt, input, 检查 / 参考答案 buttons, feedback line.

        ``compact=True`` is the answer bar ``show`` puts under the printed question: no prompt,
        and the choices by letter only (their text is printed just above).
        """
        import ipywidgets as w

        prompt = w.HTML(f"<b>{number}. </b>" * (number is not None) + html.escape(q.prompt))
        if q.kind == "single" and compact:
            entry = w.ToggleButtons(options=[(k, k) for k in q.choices], value=None,
                                    style={"button_width": "3em"})
            read = lambda: entry.value  # noqa: E731
        elif q.kind == "single":
            entry = w.RadioButtons(options=[(f"{k}. {v}", k) for k, v in q.choices.items()], value=None,
                                   layout=w.Layout(width="auto"))
            read = lambda: entry.value  # noqa: E731
        elif q.kind == "multi":
            boxes = [w.Checkbox(value=False, description=k if compact else f"{k}. {v}", indent=False,
                                layout=w.Layout(width="4em" if compact else "auto")) for k, v in q.choices.items()]
            entry = w.HBox(boxes) if compact else w.VBox(boxes)
            read = lambda: [k for k, b in zip(q.choices, boxes) if b.value]  # noqa: E731
        else:
            entry = w.Text(placeholder="数字" if q.kind == "number" else "一两句话")
            read = lambda: entry.value  # noqa: E731
        check_button = w.Button(description="检查", button_style="primary")
        reveal_button = w.Button(description="参考答案")
        feedback = w.HTML("")

        def on_check(_):
            fb = check(q, read())
            self._record({q.id: fb.correct})
            color = "green" if fb.correct else "#b00"
            feedback.value = f"<span style='color:{color}'>{'✅' if fb.correct else '❌'} {html.escape(fb.message)}</span>"

        def on_reveal(_):
            q_answer = self.reveal_text(q.id)
            feedback.value = f"<div style='color:#333'>{html.escape(q_answer).replace(chr(10), '<br>')}</div>"

        check_button.on_click(on_check)
        reveal_button.on_click(on_reveal)
        box = w.VBox(([] if compact else [prompt]) + [entry, w.HBox([check_button, reveal_button]), feedback])
        box._quiz_parts = {"entry": entry, "check": check_button, "reveal": reveal_button, "feedback": feedback,
                           "read": read}
        return box

    def show(self, ids: Iterable[str] | str | None = None) -> None:
        """Print each question's text, then display its answer bar (only the text without ipywidgets; a reopened
        notebook keeps the text, not the bar: see the module docstring)."""
        from IPython.display import display

        for q in self.select(ids):
            print(self.text(q.id))
            try:
                bar = self.question_widget(q, self.questions.index(q) + 1, compact=True)
            except ImportError:
                continue
            display(_WithTextFallback(bar, _NO_WIDGETS), raw=False)


_NO_WIDGETS = "(这里是作答栏;看不到按钮时,在练习 1 里用纯文本作答)"


class _WithTextFallback:
    """Displays a widget; front ends that cannot render widgets show ``text`` instead."""

    def __init__(self, widget, text: str) -> None:
        self.widget, self.text = widget, text

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.text
        return bundle

    def __repr__(self) -> str:
        return self.text

