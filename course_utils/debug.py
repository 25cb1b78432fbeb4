"""The standard debugging moves: overfit one batch, look at samples, sanity-check the start.

First law of DL debugging: before any full run, feed one batch repeatedly. If the
loss does not go to ~0, the code has a bug (labels that change from step to step,
a wrong loss, a cut gradient chain), not a capacity problem. The converse does not
hold: a FIXED misalignment or a consistent wrong label mapping is memorised like
correct labels, so also look at samples with their labels and at held-out accuracy.

Example::

    x, y = next(iter(loader))
    losses = overfit_one_batch(model, x, y, steps=200)
    assert losses[-1] < 0.05
    show_samples(x, y, classes)
    print(sanity_report(model, x, y))

Taught in ``07_single_batch_overfit`` §1–3.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.data import MEAN, STD

__all__ = ["overfit_one_batch", "denormalize", "show_samples", "params_without_grad", "sanity_report"]


def overfit_one_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 200, lr: float = 3e-3,
                      loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
                      optimizer: torch.optim.Optimizer | None = None) -> list[float]:
    """Train on the same batch ``steps`` times (Adam) and return the loss curve."""
    model.train()
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def denormalize(x: torch.Tensor) -> torch.Tensor:
    """Undo the CIFAR normalisation: a batch back in [0, 1] for display."""
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x * std + mean).clamp(0, 1)


def show_samples(x: torch.Tensor, y: Sequence[int] | torch.Tensor, classes: Sequence[str], n: int = 8,
                 title: str | None = None, predictions: Sequence[int] | None = None):
    """Plot the first ``n`` images with their labels (and predictions) as one row. Returns the figure."""
    import matplotlib.pyplot as plt

    n = min(n, len(x))
    images = denormalize(x[:n].detach().float().cpu()).permute(0, 2, 3, 1).numpy()
    fig, axes = plt.subplots(1, n, figsize=(1.6 * n, 2.0))
    for i, ax in enumerate(list(axes) if n > 1 else [axes]):
        ax.imshow(images[i])
        label = classes[int(y[i])]
        if predictions is not None:
            label += f"\npred: {classes[int(predictions[i])]}"
        ax.set_title(label, fontsize=8)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def params_without_grad(model: nn.Module) -> list[str]:
    """Names of trainable parameters whose gradient is None or all zeros (call after backward)."""
    return [name for name, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or not torch.any(p.grad != 0))]


def sanity_report(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int = 10,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> dict:
    """Checks before training: initial loss vs ln(C), parameters that get no gradient, label counts.

    Leaves the model's gradients zeroed.
    """
    model.train()
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    dead = params_without_grad(model)
    model.zero_grad(set_to_none=True)
    expected = math.log(num_classes)
    counts = torch.bincount(y.detach().cpu().long(), minlength=num_classes).tolist()
    return {
        "initial_loss": loss.item(),
        "expected_initial_loss": expected,
        "initial_loss_ok": abs(loss.item() - expected) < 0.5 * expected,
        "params_without_grad": dead,
        "label_counts": counts,
        "labels_ok": min(counts) > 0 or len(y) < num_classes,
    }
