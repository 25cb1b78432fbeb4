"""Checks the grader scores outside the kernel: the self-test answers of ``09_self_test`` (:data:`OUTSIDE`).

Inside the learner's kernel, code could compute the answers from the key or rebind the check; so the grader
reads the literal the learner's function returns from its source (:func:`literal_return`: literals and simple
arithmetic, nothing called or imported) and runs the check in its own process. A dict built by code is refused.

Example::

    literal_return('def f():\\n    return {"q1": "B", "q10": 0.999 ** 200}', "f")   # {'q1': 'B', 'q10': 0.8186...}
"""
from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import io
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from course_grader.kernel import clean_text
from course_grader.report import CheckOutcome

if TYPE_CHECKING:
    from course_grader.steps import Submission

__all__ = ["OUTSIDE", "LiteralError", "OutsideCheck", "outside_check", "literal_return", "score_outside", "step"]

# (module, function) of check functions whose single argument is a function returning a literal
OUTSIDE = {("course_tools.checks.nb09_self_test", "check_self_test_answers")}

_LITERAL_HINT = "请把答案直接写成字面量 dict,例如 return {\"q1\": \"<字母>\", \"q4\": \"<几个字母>\", \"q10\": <数字>}"
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_ITEMS, _MAX_STR = 200, 10_000


class LiteralError(ValueError):
    """The learner's function does not return a plain literal; ``str()`` says why, in Chinese."""


@dataclass(frozen=True)
class OutsideCheck:
    """A check cell scored by the grader: ``module.function(argument)``."""

    module: str
    function: str
    argument: str


def outside_check(check_source: str) -> OutsideCheck | None:
    """The :data:`OUTSIDE` check called by a reference check cell, or None for an ordinary check."""
    try:
        tree = ast.parse(check_source)
    except SyntaxError:
        return None
    imported = {alias.asname or alias.name: (node.module, alias.name) for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported
                and imported[node.func.id] in OUTSIDE and len(node.args) == 1 and isinstance(node.args[0], ast.Name)):
            module, function = imported[node.func.id]
            return OutsideCheck(module, function, node.args[0].id)
    return None


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        if isinstance(node.value, str) and len(node.value) > _MAX_STR:
            raise LiteralError("答案里的字符串太长")
        return node.value
    if isinstance(node, ast.Dict):
        if None in node.keys or len(node.keys) > _MAX_ITEMS:
            raise LiteralError(_LITERAL_HINT)
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) <= _MAX_ITEMS:
        items = [_value(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, str) and isinstance(right, str) and isinstance(node.op, ast.Add):
            if len(left) + len(right) > _MAX_STR:
                raise LiteralError("答案里的字符串太长")
            return left + right
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            if isinstance(node.op, ast.Pow) and (abs(right) > 10_000 or abs(left) > 1e6):
                raise LiteralError("答案里的乘方太大")
            try:
                result = _BINOPS[type(node.op)](float(left) if isinstance(node.op, ast.Pow) else left, right)
            except (ArithmeticError, ValueError):
                raise LiteralError("答案里的算式无法计算") from None
            if isinstance(result, float) and not math.isfinite(result):
                raise LiteralError("答案里的算式结果不是有限数")
            return result
    raise LiteralError(_LITERAL_HINT)


def literal_return(source: str, function: str) -> Any:
    """The literal that ``function`` (its last definition in ``source``) returns, read without running it."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise LiteralError(f"练习代码有语法错误(第 {exc.lineno} 行)") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if not defs:
        raise LiteralError(f"没有找到函数 {function}()")
    body = list(defs[-1].body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) == 1 and isinstance(body[0], ast.Raise):
        raise LiteralError("练习尚未完成(函数里还是 raise NotImplementedError)")
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return _value(body[0].value)
    if (len(body) == 2 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and isinstance(body[0].targets[0], ast.Name) and isinstance(body[1], ast.Return)
            and isinstance(body[1].value, ast.Name) and body[1].value.id == body[0].targets[0].id):
        return _value(body[0].value)
    raise LiteralError(_LITERAL_HINT)


def score_outside(check: OutsideCheck, exercise_sources: list[str]) -> tuple[bool, str]:
    """Run ``check`` in this process on the literal returned by the learner's function: (passed, message)."""
    source = next((s for s in reversed(exercise_sources) if f"def {check.argument}" in s), "")
    try:
        value = literal_return(source, check.argument)
    except LiteralError as exc:
        return False, f"评分器不运行这个函数,只读取它返回的字面量: {exc}"
    function = getattr(importlib.import_module(check.module), check.function)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            function(lambda: value)
        except AssertionError as exc:
            return False, clean_text(exc)
        except Exception as exc:  # noqa: BLE001 - a malformed answer must not stop grading
            return False, clean_text(f"{type(exc).__name__}: {exc}")
    return True, ""


async def step(sub: Submission) -> None:
    """The notebook's last step: one check outcome per check cell, from the kernel's reply or scored here."""
    plan, grade, stubbed = sub.plan, sub.grade, sub.stubbed
    for index in plan.checks:
        label = plan.label(index)
        owner = plan.owner[index]
        if index in plan.outside and not (owner in stubbed and owner in plan.flags and not sub.options.run_flagged):
            passed, message = await asyncio.to_thread(score_outside, plan.outside[index], plan.exercise_sources())
        elif index in sub.outcomes:
            cell = sub.outcomes[index]
            passed = cell.status == "ok"
            message = "" if passed else (stubbed[owner] if owner in stubbed else cell.message or cell.status)
        else:
            passed, message = False, "未运行: " + (sub.ended or "内核已退出")
        grade.checks.append(CheckOutcome(label, passed, message))
        if not passed and not any(message in note for note in grade.notes):
            grade.notes.append(f"{label}: {message}")
