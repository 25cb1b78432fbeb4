"""Checks for notebook 03 (EMA of weights).

``check_ema_update(fn, seed)``: ``fn(ema_model, model, decay, num_updates)`` updates
``ema_model`` in place. Parameters: a plain copy when ``num_updates == 0``, else
``ema = decay * ema + (1 - decay) * w``; buffers (BatchNorm statistics): copied
from ``model``. That is exactly what ``AveragedModel(model,
multi_avg_fn=get_ema_multi_avg_fn(decay))`` does in current torch, and the check
compares against it over 40 training steps of a small model with BatchNorm, all built
from ``seed`` (sizes, decay in [0.7, 0.95], data). The decay stays far from 0.5, so the
swapped-decay answer differs from the right one whatever the seed; the typical mistakes
(swapped decay, no first copy, buffers ignored or averaged, no in-place update, no
``torch.no_grad()``, an EMA warm-up, the live model modified) each get their hint.
"""
from __future__ import annotations

import copy
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from course_tools.checks import CheckFailed, call_learner, exercise_check, expect, fail, passed, seed_cpu


__all__ = ["check_ema_update", "HINTS"]


def _close(a, b) -> bool:
    return all(torch.allclose(x.float(), y.float(), rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def _shadow(params: list[torch.Tensor], model: nn.Module, t: int, weight_of_live: float) -> None:
    """A wrong-answer shadow EMA: copy at t == 0, then lerp towards the live weights by ``weight_of_live``."""
    for s, p in zip(params, model.parameters()):
        s.copy_(p.detach()) if t == 0 else s.lerp_(p.detach(), weight_of_live)


@exercise_check
def check_ema_update(fn, seed: int = 1234, steps: int = 40) -> None:
    """Run ``fn`` next to ``AveragedModel`` for ``steps`` training steps and compare."""
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    d_in, d_hidden, d_out = rnd.randint(3, 8), rnd.randint(4, 12), rnd.randint(2, 5)
    decay = rnd.uniform(0.7, 0.95)
    seed_cpu(seed)
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.BatchNorm1d(d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))
    ema_model = copy.deepcopy(model)
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
    # shadows of two typical wrong answers, to name them in the hint
    swapped = [p.detach().clone() for p in model.parameters()]
    warmed = [p.detach().clone() for p in model.parameters()]
    buffer_ema = [b.detach().clone().float() for b in model.buffers()]
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    for t in range(steps):
        x = torch.randn(16, d_in, generator=gen) + 0.5
        y = torch.randint(0, d_out, (16,), generator=gen)
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        live = [p.detach().clone() for p in model.state_dict().values()]
        before = [p.detach().clone() for p in ema_model.parameters()]
        try:
            call_learner(fn, ema_model, model, decay, t)
        except CheckFailed as exc:
            if "requires grad" in exc.found and "in-place" in exc.found:
                raise CheckFailed(exc.expected, exc.found, "在 with torch.no_grad(): 里原地修改 ema_model 的参数") from None
            raise
        reference.update_parameters(model)
        with torch.no_grad():
            _shadow(swapped, model, t, decay)
            _shadow(warmed, model, t, 1 - min(decay, (1 + t) / (10 + t)))
            for s, b in zip(buffer_ema, model.buffers()):
                s.copy_(b) if t == 0 else s.lerp_(b.float(), 1 - decay)
        expect(_close(live, list(model.state_dict().values())), "只修改 ema_model", "model 本身被改动了",
               "copy_ / lerp_ / mul_ 要作用在 ema_model 的参数上,model 只读")
        got = [p.detach() for p in ema_model.parameters()]
        ref = [p.detach() for p in reference.module.parameters()]
        if not _close(got, ref):
            _fail_parameters(t, got, before, swapped, warmed, decay)
        got_b = list(ema_model.buffers())
        if not _close(got_b, list(reference.module.buffers())):
            _fail_buffers(t, got_b, buffer_ema)
    passed(f"{steps} 步训练中与 AveragedModel + get_ema_multi_avg_fn 一致(decay={decay:.3f},seed={seed})")


def _fail_parameters(t: int, got: list, before: list, swapped: list, warmed: list, decay: float) -> None:
    """The EMA parameters differ from AveragedModel's after update ``t``: name the typical mistake it matches."""
    unchanged = _close(got, before)
    if t == 0:
        hint = ("ema_model 没有变化:要原地修改(e.copy_(p)),给循环变量重新赋值不会改动模型" if unchanged
                else "num_updates == 0 时直接 e.copy_(p),不做平均")
        fail("第一次更新(num_updates=0)把 model 的参数直接复制过去",
             "第一次更新后 ema_model 的参数与 model 不同", hint)
    if unchanged:
        hint = "ema_model 没有变化:要原地修改(e.mul_(...).add_(...) 或 e.lerp_(...)),e = ... 只是给变量重新赋值"
    elif _close(got, swapped):
        hint = "把 decay 和 1-decay 对调了:decay 应乘在旧的 EMA 上"
    elif _close(got, warmed):
        hint = "不要加 EMA 衰减率渐升:本练习要求与 AveragedModel 一致,每步都用 decay"
    else:
        hint = "ema = decay · ema + (1 - decay) · w,decay 乘在旧的 EMA 上"
    fail(f"第 {t} 次更新后参数等于 decay·ema + (1-decay)·w(decay={decay:.3f})", "与 AveragedModel 不一致", hint)


def _fail_buffers(t: int, got_b: list, buffer_ema: list) -> None:
    """The buffers differ from the model's after update ``t``: averaged like parameters, or not copied at all."""
    floats = [(g, s) for g, s in zip(got_b, buffer_ema) if g.is_floating_point()]
    averaged = t > 0 and all(torch.allclose(g.float(), s, rtol=1e-4, atol=1e-5) for g, s in floats)
    fail("缓冲区(BatchNorm 的 running_mean/var 等)直接从 model 复制",
         f"第 {t} 次更新后缓冲区与 model 不一致",
         "缓冲区不做平均,每次都从 model 复制" if averaged
         else "参数之外还要遍历 zip(ema_model.buffers(), model.buffers()) 并 copy_")


HINTS: dict[str, tuple[str, ...]] = {
    "check_ema_update": (
        "EMA 是权重的指数滑动平均:每次更新,旧的平均占大头(decay),当前权重只占一小份;第一次更新时还没有平均可言,"
        "直接取当前权重。只有参数做平均,BatchNorm 的 running_mean/var 这类缓冲区跟 model 保持一致;"
        "更新不进计算图,而且要原地改 ema_model 本身",
        "03 的「1. 手写 EMA 与 AveragedModel 对照」一节把手写的更新和 AveragedModel 逐步对照;"
        "缓冲区为什么不做平均,见「3. BatchNorm 的缓冲区:容易被忽略的另一半」",
        "最常错的是做平均的那一行:decay 和 1−decay 写反了(decay 应乘在旧的 EMA 上),或者用 e = … 给循环变量重新赋值"
        "(改不到模型,要用原地的 mul_ / add_ / lerp_ / copy_);其次是第一次更新没有直接复制、只遍历了 parameters() "
        "漏掉 buffers(),或者加了本练习不要的衰减率渐升",
    ),
}
