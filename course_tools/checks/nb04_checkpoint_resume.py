"""Checks for notebook 04 (checkpoint / resume).

``check_resume_equivalence`` trains a small dropout MLP with AdamW, a warm-up +
cosine schedule and RNG-drawn mini-batches for K steps, saves with the learner's
``save_checkpoint``, continues M steps (the reference), then builds fresh objects
in a "new process" (different init, reseeded RNG), restores with the learner's
``load_checkpoint`` and continues M steps. The losses must match step by step.
Forgetting the optimizer, the scheduler or the RNG state changes them, and the
check names the missing element first.

Example::

    check_resume_equivalence(save_checkpoint, load_checkpoint)
"""
from __future__ import annotations

import copy
import random
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import call_learner, expect, passed
from course_utils.schedule import make_scheduler


__all__ = ["check_resume_equivalence"]


def _build(init_seed: int, total_steps: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = make_scheduler(optimizer, warmup_steps=4, total_steps=total_steps)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, x, y, n_steps: int) -> list[float]:
    """``n_steps`` AdamW steps; batches are drawn from the global torch RNG, dropout too."""
    model.train()
    losses = []
    for _ in range(n_steps):
        idx = torch.randint(0, len(x), (16,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def _same_optimizer_state(saved: dict, current: dict) -> bool:
    if len(saved["state"]) == 0 or saved["state"].keys() != current["state"].keys():
        return False
    for key, state in saved["state"].items():
        other = current["state"][key]
        for name in ("exp_avg", "exp_avg_sq", "step"):
            if name not in other or not torch.equal(torch.as_tensor(state[name]), torch.as_tensor(other[name])):
                return False
    return True


def check_resume_equivalence(save_checkpoint, load_checkpoint) -> None:
    """Save after K steps, restore into fresh objects, continue: losses must equal the uninterrupted run."""
    rng = random.SystemRandom()
    seed = rng.randrange(1, 10**6)
    k_steps, m_steps, epoch = rng.randint(5, 9), 6, rng.randint(1, 5)
    total = k_steps + m_steps + 4
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 12, generator=gen)
    y = torch.randint(0, 4, (128,), generator=gen)

    model, optimizer, scheduler = _build(seed, total)
    _train(model, optimizer, scheduler, x, y, k_steps)
    snap_model = copy.deepcopy(model.state_dict())
    snap_opt = copy.deepcopy(optimizer.state_dict())
    snap_last_epoch = scheduler.last_epoch
    snap_rng = torch.get_rng_state().clone()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        call_learner(save_checkpoint, path, model, optimizer, scheduler, epoch, k_steps)
        expect(path.is_file() and path.stat().st_size > 0, f"save_checkpoint 把检查点写到 {path.name}",
               "文件不存在或为空")
        try:
            torch.load(path, weights_only=True)
        except Exception as exc:
            raise AssertionError(f"期望 检查点能用 torch.load(weights_only=True) 读取;实际 {type(exc).__name__}"
                                 "(不要存 numpy 状态、Namespace 等任意对象)") from None
        torch.set_rng_state(snap_rng)  # whatever save did, the reference continues from the saved point
        reference = _train(model, optimizer, scheduler, x, y, m_steps)

        # a "new process": different init, RNG reseeded as a fresh script would do
        fresh_model, fresh_opt, fresh_sched = _build(seed + 7919, total)
        torch.manual_seed(seed + 1)
        found = call_learner(load_checkpoint, path, fresh_model, fresh_opt, fresh_sched)

    expect(isinstance(found, (tuple, list)) and len(found) == 2 and tuple(int(v) for v in found) == (epoch, k_steps),
           f"load_checkpoint 返回 (epoch, step) = ({epoch}, {k_steps})", f"{found!r}")
    restored = fresh_model.state_dict()
    expect(all(torch.equal(restored[k], v) for k, v in snap_model.items()),
           "模型权重与保存时相同", "权重不同(model.state_dict() 存了吗?load_state_dict 调了吗?)")
    expect(_same_optimizer_state(snap_opt, fresh_opt.state_dict()),
           "优化器状态(AdamW 的 exp_avg / exp_avg_sq / step)被恢复",
           "与保存时不同——忘了 optimizer.state_dict()?动量清零 = 训练“失忆”")
    expect(fresh_sched.last_epoch == snap_last_epoch,
           f"学习率调度器的进度 last_epoch = {snap_last_epoch}",
           f"{fresh_sched.last_epoch}——忘了 scheduler.state_dict()?warm-up 会从头再来")
    expect(torch.equal(torch.get_rng_state(), snap_rng),
           "torch 随机数状态与保存时相同(dropout、随机采样都依赖它)",
           "不同——忘了保存/恢复 torch.get_rng_state()?")
    resumed = _train(fresh_model, fresh_opt, fresh_sched, x, y, m_steps)
    worst = max(range(m_steps), key=lambda i: abs(resumed[i] - reference[i]))
    expect(abs(resumed[worst] - reference[worst]) <= 1e-6,
           f"续训后 {m_steps} 步的 loss 与不中断时逐步相同",
           f"续训第 {worst + 1} 步 loss {resumed[worst]:.6f},不中断为 {reference[worst]:.6f}")
    passed(f"断点续训等价: 第 {k_steps} 步存档、换新对象恢复后,{m_steps} 步 loss 与不中断完全一致")
