"""Checks for 07_single_batch_overfit: writing the overfit loop, and diagnosing training bugs from curves.

``train_with_bug`` holds the bug zoo (the same five training steps the notebook shows);
``mystery_functions`` hands the learner three of them under opaque names to practise on.
``check_diagnose`` draws fresh, shuffled runs each time, so a fixed answer cannot pass.
"""
from __future__ import annotations

import math
import random
from typing import Callable

import torch
import torch.nn.functional as F

from course_tools.checks import call_learner, expect, passed
from course_utils.clipping import global_grad_norm
from course_utils.models import build_model

__all__ = ["BUGS", "train_with_bug", "mystery_functions", "check_overfit_one_batch", "check_diagnose"]


BUGS = ("healthy", "shuffled_labels", "detached", "wrong_loss", "lr_too_small")


def train_with_bug(bug: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 100,
                   lr: float = 3e-3, seed: int = 0) -> tuple[list[float], list[float]]:
    """Overfit ``(x, y)`` with one of ``BUGS`` injected; returns (losses, pre-step grad norms)."""
    if bug not in BUGS:
        raise ValueError(f"未知的 bug {bug!r};可选: {BUGS}")
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * 1e-3 if bug == "lr_too_small" else lr)
    model.train()
    losses, norms = [], []
    for _ in range(steps):
        targets = y[torch.randperm(len(y), generator=g)] if bug == "shuffled_labels" else y
        logits = model(x)
        if bug == "detached":
            logits = logits.detach().requires_grad_()  # backward runs, but never reaches the weights
        if bug == "wrong_loss":
            logits = logits.softmax(dim=-1)  # cross_entropy applies log_softmax again
        loss = F.cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(global_grad_norm(model.parameters()).item())
        optimizer.step()
        losses.append(loss.item())
    return losses, norms


def _random_batch(seed: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def mystery_functions(seed: int = 0) -> dict[str, Callable]:
    """Three training functions, each with a different bug, under names that do not tell which.

    Each is ``fn(model, x, y, steps=100) -> (losses, grad_norms)``.
    """
    bugs = random.Random(seed).sample([b for b in BUGS if b != "healthy"], 3)

    def make(bug: str) -> Callable:
        def mystery(model, x, y, steps: int = 100):
            return train_with_bug(bug, model, x, y, steps=steps, seed=seed)
        return mystery

    return {f"mystery_{name}": make(bug) for name, bug in zip("abc", bugs)}


def check_overfit_one_batch(overfit_one_batch: Callable) -> None:
    """The learner's loop must train the given model in place until the given batch is memorised."""
    seed = random.randint(0, 10_000)
    torch.manual_seed(seed)
    model = build_model("tiny", width=8)
    x, y = _random_batch(seed + 1)
    with torch.no_grad():
        initial = F.cross_entropy(model(x), y).item()
    steps = 150
    losses = call_learner(overfit_one_batch, model, x, y, steps=steps, lr=3e-3)
    expect(isinstance(losses, (list, tuple)) and len(losses) == steps, f"返回长度为 {steps} 的 loss 列表",
           f"{type(losses).__name__} 长度 {len(losses) if hasattr(losses, '__len__') else '?'}")
    expect(all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses),
           "列表里是 Python float(用 loss.item())", f"{type(losses[0]).__name__}")
    expect(math.isclose(losses[0], initial, rel_tol=1e-3), f"第 1 个 loss 是模型在这批数据上的初始 loss {initial:.4f}",
           f"{losses[0]:.4f}(是不是换了数据,或先更新了一步?)")
    with torch.no_grad():
        final = F.cross_entropy(model(x), y).item()
    expect(final < 0.05, "训练后模型在这一个 batch 上的 loss < 0.05(就地训练传入的 model)", f"{final:.4f}")
    expect(losses[-1] < 0.1, "返回的最后一个 loss 接近 0", f"{losses[-1]:.4f}")
    passed(f"{steps} 步把一个 batch 的 loss 从 {losses[0]:.3f} 压到 {losses[-1]:.4f}")


def check_diagnose(diagnose: Callable) -> None:
    """Runs three hidden buggy trainings plus a healthy one, in random order, and asks for each bug's name."""
    rng = random.Random()
    bugs = rng.sample([b for b in BUGS if b != "healthy"], 3) + ["healthy"]
    rng.shuffle(bugs)
    for i, bug in enumerate(bugs, 1):
        seed = rng.randint(0, 10_000)
        torch.manual_seed(seed)
        model = build_model("tiny", width=8)
        x, y = _random_batch(seed + 1)
        losses, norms = train_with_bug(bug, model, x, y, steps=100, seed=seed)
        answer = call_learner(diagnose, list(losses), list(norms))
        expect(answer in BUGS, f"返回 {BUGS} 之一", f"{answer!r}")
        expect(answer == bug, f"第 {i} 个隐藏的训练函数诊断为 {bug!r}", f"{answer!r}")
    passed(f"{len(bugs)} 条隐藏的训练曲线(随机顺序)全部诊断正确")
