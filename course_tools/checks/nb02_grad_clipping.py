"""Checks for notebook 02 (gradient clipping).

``check_global_clip(fn, seed)``: ``fn(parameters, max_norm)`` must clip all gradients by their global L2 norm, in
place, and return the pre-clip norm, like ``torch.nn.utils.clip_grad_norm_``. Shapes come from ``seed`` and each
case's global norm is an exact multiple of its threshold (three clearly above, one below), so every typical mistake
fails whatever the seed: per-parameter clipping, the post-clip norm returned, small gradients scaled up, a
generator iterated twice, a missing square root, ``g = g * c`` instead of an in-place update, clamping.
``check_clip_audit(fn, seed)``: ``fn(step_fn)`` must say whether the clipping inside a train step
``step_fn(model, optimizer, scaler, x, y, max_norm)`` really limits the applied update, on hidden correct and
buggy steps in an order shuffled by ``seed``, torch's CPU generator seeded from ``seed`` before each call (an
audit that relies on outside RNG state is caught by the 50-seed sweep in ``tests/test_exercise_sweeps.py``).
"""
from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import CheckFailed, call_learner, exercise_check, expect, fail, passed, seed_cpu
from course_utils.clipping import clip_gradients


__all__ = ["check_global_clip", "HIDDEN_CANDIDATES", "check_clip_audit", "HINTS"]


# ---------------------------------------------------------------- exercise 1
# (number of params, global norm / max_norm, max_norm, one param without grad, pass a generator)
_CASES = [(4, 3.0, 1.0, False, False), (5, 2.5, 2.0, True, True), (3, 0.3, 5.0, False, False),
          (6, 10.0, 0.5, True, False)]


def _make_params(gen: torch.Generator, n: int, target_norm: float, with_none: bool) -> list[nn.Parameter]:
    params = []
    for i in range(n):
        ndim = int(torch.randint(1, 4, (1,), generator=gen))
        shape = tuple(int(s) for s in torch.randint(1, 7, (ndim,), generator=gen))
        p = nn.Parameter(torch.randn(shape, generator=gen))
        if not (with_none and i == 1):
            p.grad = torch.randn(shape, generator=gen)
        params.append(p)
    grads = [p.grad for p in params if p.grad is not None]
    total = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    for g in grads:  # an exact global norm: the case is clearly above or below the threshold
        g.mul_(target_norm / total)
    return params


def _clone(params: list[nn.Parameter]) -> list[nn.Parameter]:
    out = []
    for p in params:
        q = nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


def _same_grads(a: list[nn.Parameter], b: list[nn.Parameter]) -> bool:
    for p, q in zip(a, b):
        if (p.grad is None) != (q.grad is None):
            return False
        if p.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7):
            return False
    return True


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))


def _common_factor(params: list[nn.Parameter], original: list[nn.Parameter]) -> float | None:
    """The factor c when every gradient equals c times its original, else None."""
    if [p.grad is None for p in params] != [p.grad is None for p in original]:
        return None
    new = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    old = torch.cat([p.grad.flatten() for p in original if p.grad is not None])
    coef = float(new @ old / (old @ old))
    return coef if torch.allclose(new, coef * old, rtol=1e-4, atol=1e-7) else None


def _norm_hint(got: float, params: list[nn.Parameter], max_norm: float, pre: float) -> str:
    """Name the likely mistake behind a wrong returned norm."""
    norms = [float(p.grad.norm()) for p in params if p.grad is not None]
    if _close(got, min(pre, max_norm)):
        return "这是裁剪后的范数;应返回裁剪前的全局范数"
    if _close(got, pre ** 2):
        return "这是平方和,忘了开平方"
    if _close(got, sum(norms)):
        return "把各参数的范数直接相加了;全局范数 = 各参数范数平方和再开方"
    if _close(got, max(norms)):
        return "这是最大的单个参数范数;全局范数要把所有梯度看成一个向量"
    return "全局范数 = sqrt(Σ_p ‖g_p‖²),在修改梯度之前算好并返回"


@exercise_check
def check_global_clip(fn, seed: int = 1234) -> None:
    """Compare ``fn`` with ``clip_grad_norm_`` on four parameter lists built from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for n, ratio, max_norm, with_none, as_generator in _CASES:
        params = _make_params(gen, n, ratio * max_norm, with_none)
        original = _clone(params)
        ref = _clone(params)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref, max_norm))
        per_param = _clone(params)
        for p in per_param:
            if p.grad is not None:
                torch.nn.utils.clip_grad_norm_([p], max_norm)
        weights = [p.detach().clone() for p in params]
        arg = (p for p in params) if as_generator else params
        out = call_learner(fn, arg, max_norm)
        expect(out is not None, "返回裁剪前的全局范数", "返回了 None", "函数最后 return 裁剪前的范数")
        try:
            got = float(out)
        except (TypeError, ValueError):
            raise CheckFailed("返回一个数(0 维张量或 float)", f"{type(out).__name__}") from None
        expect(all(torch.equal(w, p.detach()) for w, p in zip(weights, params)), "只修改 .grad",
               "参数值被改动了", "裁剪只缩放 p.grad,不碰 p 本身")
        if ref_norm <= max_norm:
            expect(_same_grads(params, ref), f"全局范数 {ref_norm:.4f} 未超过阈值 {max_norm} 时梯度保持不变",
                   "梯度被改动了", "只有范数超过阈值时才缩放;无条件乘 max_norm/范数 会把小梯度放大")
        elif not _same_grads(params, ref):
            if _same_grads(params, original):
                hint = ("parameters 是生成器,只能遍历一次:先 params = list(parameters)" if as_generator
                        else "梯度没有变:要原地修改(g.mul_(coef)),g = g * coef 只是给变量重新赋值")
            elif _same_grads(params, per_param):
                hint = "看起来是逐个参数裁剪(每个参数各自缩放);所有梯度要共用一个系数 max_norm / 全局范数"
            elif (coef := _common_factor(params, original)) is not None:
                hint = (f"所有梯度乘了同一个系数 {coef:.4g},方向对了,但系数应为 max_norm / 全局范数 = "
                        f"{max_norm / ref_norm:.4g}" + ("" if _close(got, ref_norm)
                                                        else ":" + _norm_hint(got, original, max_norm, ref_norm)))
            elif all(p.grad is None or float(p.grad.abs().max()) <= max_norm * (1 + 1e-6) for p in params):
                hint = "看起来是逐元素截断(clip_grad_value_);这里要按全局 L2 范数整体缩放"
            else:
                hint = "所有梯度乘同一个系数 max_norm / (全局范数 + 1e-6)"
            fail("所有梯度共用一个缩放系数 max_norm / 全局范数,与 clip_grad_norm_ 一致",
                 f"全局范数 {ref_norm:.4f} 超过阈值 {max_norm},裁剪后的梯度与 clip_grad_norm_ 不一致", hint)
        if not _close(got, ref_norm):
            fail(f"返回裁剪前的全局范数 {ref_norm:.5f}", f"{got:.5f}", _norm_hint(got, original, max_norm, ref_norm))
    passed(f"全局范数裁剪与 torch.nn.utils.clip_grad_norm_ 一致(4 组参数,含未超阈值的情况;seed={seed})")


# ---------------------------------------------------------------- exercise 2
# The moves of a train step under an fp16 GradScaler; ``t`` holds the step's arguments by name.
_MOVES: dict[str, Callable[[SimpleNamespace], Any]] = {
    "zero_grad": lambda t: t.optimizer.zero_grad(),
    "backward": lambda t: t.scaler.scale(F.cross_entropy(t.model(t.x), t.y)).backward(),
    "unscale_": lambda t: t.scaler.unscale_(t.optimizer),
    "clip": lambda t: torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.max_norm),
    "clip a list": lambda t: torch.nn.utils.clip_grad_norm_(list(t.model.parameters()), t.max_norm, foreach=False),
    "clip_gradients": lambda t: clip_gradients(t.model.parameters(), t.max_norm, scaler=t.scaler,
                                               optimizer=t.optimizer),
    "clip each": lambda t: [torch.nn.utils.clip_grad_norm_([p], t.max_norm) for p in t.model.parameters()],
    "step": lambda t: (t.scaler.step(t.optimizer), t.scaler.update()),  # an enabled scaler skips an inf/NaN step
}


def _train_step(*moves: str) -> Callable[..., None]:
    """A hidden candidate ``step(model, optimizer, scaler, x, y, max_norm)``: the named ``_MOVES``, in order."""
    def step(model, optimizer, scaler, x, y, max_norm) -> None:
        t = SimpleNamespace(model=model, optimizer=optimizer, scaler=scaler, x=x, y=y, max_norm=max_norm)
        for move in moves:
            _MOVES[move](t)
    return step


_JUDGED_BAD = ("正确的写法被判为无效:检查你的实验 (1) 梯度范数远大于 max_norm(把输入放大);"
               "(2) 优化器是无动量、无权重衰减的 SGD;(3) 施加的梯度范数 = 权重变化的范数 / lr")
_UNDETECTED = "你的实验里梯度范数可能没有超过 max_norm:把输入放大(例如 ×100),让裁剪必须生效"

# (train step, clipping effective?, description, hint when misjudged)
HIDDEN_CANDIDATES: list[tuple[Callable, bool, str, str]] = [
    (_train_step("zero_grad", "backward", "unscale_", "clip", "step"), True, "unscale_ → clip_grad_norm_ → step",
     _JUDGED_BAD),
    (_train_step("zero_grad", "backward", "clip_gradients", "step"), True,
     "clip_gradients(..., scaler=scaler, optimizer=optimizer)", _JUDGED_BAD),
    (_train_step("backward", "unscale_", "clip a list", "step", "zero_grad"), True, "zero_grad 放在最后的正确写法",
     _JUDGED_BAD + ";这个候选在 step 之后才清空梯度,别去读 step 之后的 .grad"),
    (_train_step("zero_grad", "backward", "clip", "step"), False, "裁剪放在 unscale_ 之前(裁的是放大后的梯度)",
     "施加的更新只有 max_norm / scale:'不超过阈值'不等于'裁剪有效',要求它等于 max_norm;"
     "并确认你用的 GradScaler 是启用的(enabled=True)"),
    (_train_step("zero_grad", "clip", "backward", "step"), False, "裁剪放在 backward 之前", _UNDETECTED),
    (_train_step("zero_grad", "backward", "step", "clip"), False, "裁剪放在 step 之后",
     "step 之后 .grad 虽然被裁了,但权重已经按未裁剪的梯度更新:要看权重的变化,而不是 step 之后的 .grad"),
    (_train_step("zero_grad", "backward", "step"), False, "完全没有裁剪", _UNDETECTED),
    (_train_step("zero_grad", "backward", "unscale_", "clip each", "step"), False, "逐个参数裁剪(不是全局范数)",
     "逐个参数裁剪时每个参数都不超过 max_norm,全局范数却更大:要比较所有参数合起来的范数"),
]


@exercise_check
def check_clip_audit(fn, seed: int = 1234) -> None:
    """Run the learner's audit on the hidden candidates (order from ``seed``) and compare with the truth."""
    rng = random.Random(seed)
    order = list(HIDDEN_CANDIDATES)
    rng.shuffle(order)
    for step_fn, truth, description, hint in order:
        seed_cpu(rng.randrange(1_000_000))  # an audit that builds no seeded inputs is caught by the sweep
        verdict = call_learner(fn, step_fn)
        expect(isinstance(verdict, bool) or (isinstance(verdict, torch.Tensor) and verdict.numel() == 1),
               "返回 True/False", f"{type(verdict).__name__}", "返回一个布尔值:裁剪是否真的把施加的更新限制在阈值上")
        verdict = bool(verdict)
        expect(verdict == truth, f"候选「{description}」判为{'有效' if truth else '无效'}",
               f"判为{'有效' if verdict else '无效'}", hint)
    passed(f"{len(order)} 个隐藏候选训练步(3 个正确,5 个有错)全部判断正确(seed={seed})")


HINTS: dict[str, tuple[str, ...]] = {
    "check_global_clip": (
        "全局范数裁剪把所有参数的梯度看成一个长向量:它的 L2 范数超过 max_norm 时,所有梯度乘同一个系数,"
        "方向不变;没超过时一点不动。返回的是裁剪之前的那个范数",
        "02 的「1. clip_grad_norm_ 做了什么」一节一步步算了全局范数和缩放系数,可以拿它的数字对照你的中间结果",
        "常错的几处:parameters 可能是生成器,只能遍历一次(先存成列表);缩放要原地改 .grad(用 mul_),"
        "给局部变量重新赋值改不到梯度;系数只在小于 1 时才乘;范数要在改梯度之前算好",
    ),
    "check_clip_audit": (
        "裁剪「有效」的意思是:优化器真正施加的那次更新,范数被限制在 max_norm。只看 step 之后的 .grad 不够,"
        "要看权重实际移动了多少",
        "02 的「3. fp16 下的顺序:先 unscale_,再裁剪」一节讲了放错位置的裁剪为什么没起作用;练习 2 的说明列出了实验要满足的条件",
        "常错的是实验本身:梯度要远大于 max_norm(把输入放大很多倍),否则有没有裁剪都一样;用无动量、无权重衰减的 SGD,"
        "这时施加的梯度范数 = 权重变化的范数 / lr;GradScaler 要启用;判断时留一点浮点误差的余量",
    ),
}
