"""Learning-rate schedule: linear warm-up, then cosine decay, stepped once per OPTIMIZER step.

A classic bug: stepping the scheduler once per epoch (or building it with the
epoch count) makes warm-up last thousands of steps or not happen at all. Log the
lr you actually used and compare it with ``lr_at``.

Example::

    sched = make_scheduler(opt, warmup_steps=100, total_steps=10_000)
    for step in range(total):
        ...; opt.step(); sched.step()

``set_base_lr`` gives a restored schedule a new base lr (``--resume --lr``, the professional
script's rollback factor).

Taught in ``06_monitoring`` §2 (the warm-up bug).
"""
from __future__ import annotations

import math

import torch

__all__ = ["warmup_cosine", "lr_at", "make_scheduler", "set_base_lr"]


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> float:
    """Multiplier of the base lr for 0-based optimizer step ``step``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> float:
    """The lr used by 0-based optimizer step ``step`` (what a correct log must show)."""
    return base_lr * warmup_cosine(step, warmup_steps, total_steps, min_ratio)


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                   min_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following ``warmup_cosine``; call ``.step()`` after every ``optimizer.step()``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, warmup_steps, total_steps, min_ratio))


def set_base_lr(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Make ``lr`` the base lr of a restored LambdaLR schedule, and the next step's lr follow it.

    A restored optimizer carries the old lr in its param groups and the scheduler its old base lr:
    without this, ``--resume --lr X`` would be ignored. With an unchanged lr it recomputes the
    same value bit for bit (LambdaLR's own formula).
    """
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
