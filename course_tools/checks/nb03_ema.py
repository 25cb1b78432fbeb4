"""Checks for notebook 03 (EMA of weights).

``check_ema_update(fn)``: ``fn(ema_model, model, decay, num_updates)`` updates
``ema_model`` in place. Parameters: a plain copy when ``num_updates == 0``, else
``ema = decay * ema + (1 - decay) * w``; buffers (BatchNorm statistics): copied
from ``model``. That is exactly what ``AveragedModel(model,
multi_avg_fn=get_ema_multi_avg_fn(decay))`` does in current torch, and the check
compares against it over many training steps of a small model with BatchNorm.
"""
from __future__ import annotations

import copy
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from course_tools.checks import call_learner, expect, passed


__all__ = ["check_ema_update"]


def _close(a, b) -> bool:
    return all(torch.allclose(x.float(), y.float(), rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def check_ema_update(fn, steps: int = 40) -> None:
    """Run ``fn`` next to ``AveragedModel`` for ``steps`` training steps and compare."""
    seed = random.randrange(1_000_000)
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    d_in, d_hidden, d_out = rnd.randint(3, 8), rnd.randint(4, 12), rnd.randint(2, 5)
    decay = rnd.uniform(0.7, 0.95)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.BatchNorm1d(d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))
    ema_model = copy.deepcopy(model)
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
    swapped = [p.detach().clone() for p in model.parameters()]  # the "swapped beta" answer, for the hint
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    for t in range(steps):
        x = torch.randn(16, d_in, generator=gen) + 0.5
        y = torch.randint(0, d_out, (16,), generator=gen)
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        live = [p.detach().clone() for p in model.state_dict().values()]
        call_learner(fn, ema_model, model, decay, t)
        reference.update_parameters(model)
        with torch.no_grad():
            for s, p in zip(swapped, model.parameters()):
                s.copy_(p) if t == 0 else s.mul_(1 - decay).add_(p.detach(), alpha=decay)
        expect(_close(live, list(model.state_dict().values())), "只修改 ema_model", "model 本身被改动了")
        got = [p.detach() for p in ema_model.parameters()]
        ref = [p.detach() for p in reference.module.parameters()]
        if t == 0:
            expect(_close(got, ref), "第一次更新(num_updates=0)把 model 的参数直接复制过去",
                   "第一次更新后 ema_model 的参数与 model 不同")
        if not _close(got, ref):
            hint = "(看起来把 decay 和 1-decay 对调了: decay 应乘在旧的 EMA 上)" if _close(got, swapped) else ""
            expect(False, f"第 {t} 次更新后参数等于 decay·ema + (1-decay)·w(decay={decay:.3f})",
                   f"与 AveragedModel 不一致{hint}")
        got_b = list(ema_model.buffers())
        ref_b = list(reference.module.buffers())
        expect(_close(got_b, ref_b), "缓冲区(BatchNorm 的 running_mean/var 等)直接从 model 复制",
               f"第 {t} 次更新后缓冲区与 model 不一致")
    passed(f"{steps} 步训练中与 AveragedModel + get_ema_multi_avg_fn 一致(decay={decay:.3f},seed={seed})")
