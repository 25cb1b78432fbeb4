"""The CNNs used across the workbook.

``SmallCNN`` has BatchNorm on purpose: its running statistics are buffers, not
parameters, which is what the EMA and checkpoint lessons need. ``TinyCNN`` is the
"smallest model first" for quick demos. Both train at hundreds of samples per
second on two CPU cores.

Example::

    model = build_model("small")      # or "tiny"
    model = build_model("tiny", dropout=0.2)

``dropout`` (default 0: no layer at all) puts ``nn.Dropout`` before the head: the one random
layer of the course's models, driven by torch's global generator. Pitfall: with it, a resumed
run matches the uninterrupted one only if the checkpoint restored the RNG state.

Taught in ``00_start_here`` §4 (the sanity run builds and counts one); every notebook trains them.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN", "TinyCNN", "MODELS", "build_model", "count_parameters"]


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()  # p = 0: no layer, no random numbers drawn


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True), nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU-pool stages and a linear head; ``width`` scales the channels."""

    def __init__(self, num_classes: int = 10, width: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        self.features = nn.Sequential(_block(3, width), _block(width, 2 * width), _block(2 * width, 4 * width))
        self.drop = _dropout(dropout)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x).mean(dim=(2, 3))))


class TinyCNN(nn.Module):
    """Two conv stages without BatchNorm: fast, and easy to reason about."""

    def __init__(self, num_classes: int = 10, width: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.drop = _dropout(dropout)
        self.head = nn.Linear(2 * width * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x).flatten(1)))


MODELS = {"small": SmallCNN, "tiny": TinyCNN}


def build_model(name: str = "small", num_classes: int = 10, **kwargs) -> nn.Module:
    """Build a model by name: ``"small"`` (SmallCNN) or ``"tiny"`` (TinyCNN)."""
    if name not in MODELS:
        raise ValueError(f"未知模型 {name!r};可选: {', '.join(MODELS)}")
    return MODELS[name](num_classes=num_classes, **kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
