"""Evaluation of a classifier: its accuracy and mean loss over a set of batches.

What: ``evaluate(model, batches, device, dtype)`` runs ``model`` in eval mode (no gradients, under autocast
``dtype``: None is fp32) over ``batches`` and returns ``{"acc", "loss"}``: the fraction classified right and
the mean cross-entropy per sample, over every sample (not the mean of the batches' means).

Pitfalls handled:
- the model's mode is restored: evaluating in the middle of training must not leave dropout off or
  BatchNorm frozen (nor switch a model that was in eval mode to training);
- the loss is computed in fp32 from the logits (``logits.float()``) whatever the autocast dtype: a bf16
  cross-entropy rounds the mean of many samples;
- a last batch smaller than the others counts for its size: sums per sample, divided once at the end.

Example::

    metrics = evaluate(model, test_loader, device, torch.bfloat16)   # {"acc": 0.71, "loss": 0.83}
    metrics_ema = evaluate(ema.module, test_loader, device, None)

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (its ``evaluate_now``: the weights and the
EMA weights, each batch a heartbeat).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from course_utils.amp import autocast

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable, device: torch.device,
             dtype: torch.dtype | None = None) -> dict[str, float]:
    """{"acc", "loss"} (the mean per sample) of ``model`` over ``batches`` of (images, labels); restores the
    model's train/eval mode."""
    was_training = model.training
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, dtype):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        total += len(y)
    model.train(was_training)
    return {"acc": correct / total, "loss": loss_sum / total}
