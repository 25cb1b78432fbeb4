"""Checks for notebook 02 (gradient clipping).

``check_global_clip(fn)``: ``fn(parameters, max_norm)`` must clip all gradients by
their global L2 norm, in place, and return the pre-clip norm, like
``torch.nn.utils.clip_grad_norm_``.

``check_clip_audit(fn)``: ``fn(step_fn)`` must say whether the clipping inside a
train step ``step_fn(model, optimizer, scaler, x, y, max_norm)`` really limits the
applied update. It is run on hidden candidate steps, correct and buggy, in a
shuffled order, so a constant answer cannot pass.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import call_learner, expect, passed
from course_utils.clipping import clip_gradients


__all__ = ["check_global_clip", "HIDDEN_CANDIDATES", "check_clip_audit"]


# ---------------------------------------------------------------- exercise 1
def _make_params(gen: torch.Generator, n: int, scale: float, with_none: bool) -> list[nn.Parameter]:
    params = []
    for i in range(n):
        shape = tuple(int(s) for s in torch.randint(1, 7, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                                    generator=gen))
        p = nn.Parameter(torch.randn(shape, generator=gen))
        if not (with_none and i == 1):
            p.grad = torch.randn(shape, generator=gen) * scale
        params.append(p)
    return params


def _clone(params: list[nn.Parameter]) -> list[nn.Parameter]:
    out = []
    for p in params:
        q = nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


def _grads(params: list[nn.Parameter]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad for p in params]


def _same_grads(a: list[nn.Parameter], b: list[nn.Parameter]) -> bool:
    for p, q in zip(a, b):
        if (p.grad is None) != (q.grad is None):
            return False
        if p.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7):
            return False
    return True


def check_global_clip(fn) -> None:
    """Compare ``fn`` with ``clip_grad_norm_`` on random parameter lists."""
    seed = random.randrange(1_000_000)
    gen = torch.Generator().manual_seed(seed)
    # (number of params, grad scale, max_norm, one param without grad, pass a generator)
    cases = [(4, 1.0, 1.0, False, False), (5, 0.4, 2.0, True, True), (3, 0.01, 5.0, False, False),
             (6, 3.0, 0.5, True, False)]
    for n, scale, max_norm, with_none, as_generator in cases:
        params = _make_params(gen, n, scale, with_none)
        ref = _clone(params)
        per_param = _clone(params)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref, max_norm))
        post_norm = min(ref_norm, max_norm)
        for p in per_param:
            if p.grad is not None:
                torch.nn.utils.clip_grad_norm_([p], max_norm)
        weights = [p.detach().clone() for p in params]
        arg = (p for p in params) if as_generator else params
        out = call_learner(fn, arg, max_norm)
        expect(out is not None, "返回裁剪前的全局范数", "返回了 None")
        try:
            got = float(out)
        except (TypeError, ValueError):
            raise AssertionError(f"期望返回一个数(张量或 float);实际是 {type(out).__name__}") from None
        below = ref_norm <= max_norm
        if below:
            expect(_same_grads(params, ref), f"全局范数 {ref_norm:.4f} 未超过阈值 {max_norm} 时梯度保持不变",
                   "梯度被改动了(只有超过阈值才缩放)")
        elif not _same_grads(params, ref):
            looks_per_param = _same_grads(params, per_param)
            expect(False, "所有梯度共用一个缩放系数 max_norm / 全局范数",
                   "看起来是逐个参数裁剪(每个参数各自缩放)" if looks_per_param else "裁剪后的梯度与 clip_grad_norm_ 不一致"
                   + (";注意 parameters 可能是生成器,只能遍历一次" if as_generator else ""))
        if not abs(got - ref_norm) <= 1e-4 * max(1.0, ref_norm):
            hint = "(这是裁剪后的范数,应返回裁剪前的)" if abs(got - post_norm) <= 1e-4 * max(1.0, post_norm) else ""
            expect(False, f"返回裁剪前的全局范数 {ref_norm:.5f}", f"{got:.5f}{hint}")
        expect(all(torch.equal(w, p.detach()) for w, p in zip(weights, params)), "只修改 .grad", "参数值被改动了")
    passed(f"全局范数裁剪与 torch.nn.utils.clip_grad_norm_ 一致(4 组随机参数,含未超阈值的情况;seed={seed})")


# ---------------------------------------------------------------- exercise 2
def _loss(model, x, y):
    return F.cross_entropy(model(x), y)


def _correct_manual(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(_loss(model, x, y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _correct_helper(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    loss = _loss(model, x, y)
    scaler.scale(loss).backward()
    clip_gradients(model.parameters(), max_norm, scaler=scaler, optimizer=optimizer)
    scaler.step(optimizer)  # an enabled scaler skips the step itself when the grads are inf/NaN
    scaler.update()


def _correct_zero_grad_last(model, optimizer, scaler, x, y, max_norm):
    scaler.scale(_loss(model, x, y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm, foreach=False)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def _bug_before_unscale(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _bug_before_backward(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad()
    loss = _loss(model, x, y)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def _bug_after_step(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _bug_no_clip(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    scaler.step(optimizer)
    scaler.update()


def _bug_per_parameter(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    scaler.unscale_(optimizer)
    for p in model.parameters():
        torch.nn.utils.clip_grad_norm_([p], max_norm)
    scaler.step(optimizer)
    scaler.update()


HIDDEN_CANDIDATES = [
    (_correct_manual, True, "unscale_ → clip_grad_norm_ → step"),
    (_correct_helper, True, "clip_gradients(..., scaler=scaler, optimizer=optimizer)"),
    (_correct_zero_grad_last, True, "zero_grad 放在最后的正确写法"),
    (_bug_before_unscale, False, "裁剪放在 unscale_ 之前(裁的是放大后的梯度)"),
    (_bug_before_backward, False, "裁剪放在 backward 之前"),
    (_bug_after_step, False, "裁剪放在 step 之后"),
    (_bug_no_clip, False, "完全没有裁剪"),
    (_bug_per_parameter, False, "逐个参数裁剪(不是全局范数)"),
]


def check_clip_audit(fn) -> None:
    """Run the learner's audit on the hidden candidates (shuffled) and compare with the truth."""
    order = list(HIDDEN_CANDIDATES)
    random.shuffle(order)
    for step_fn, truth, description in order:
        torch.manual_seed(random.randrange(1_000_000))  # the audit must not depend on outside RNG state
        verdict = call_learner(fn, step_fn)
        expect(isinstance(verdict, (bool, torch.Tensor)) and not (isinstance(verdict, torch.Tensor)
                                                                  and verdict.numel() != 1),
               "返回 True/False", f"{type(verdict).__name__}")
        verdict = bool(verdict)
        expect(verdict == truth, f"候选「{description}」判为 {'有效' if truth else '无效'}",
               f"判为 {'有效' if verdict else '无效'}")
    passed(f"{len(order)} 个隐藏候选训练步(3 个正确,5 个有错)全部判断正确")
