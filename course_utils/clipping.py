"""Gradient clipping by global L2 norm: the fuse that stops one bad batch from wrecking the weights.

All gradients are treated as one long vector; if its L2 norm exceeds ``max_norm``
every gradient is multiplied by the same factor ``max_norm / norm``. Direction is
kept, only the step length shrinks.

Pitfalls:
- Clip after ``backward()`` and before ``optimizer.step()``; with a GradScaler call
  ``scaler.unscale_(optimizer)`` first, or the threshold applies to scaled gradients.
- Log the norm returned here: it is the PRE-clip norm, the alarm signal. A logged
  value above ``max_norm`` is expected; it means clipping fired.
- Under bf16/fp32 nothing else notices an inf/NaN gradient: check ``finite`` and
  skip the step rather than writing NaN into the weights.

Example::

    scaler.scale(loss).backward()
    result = clip_gradients(model.parameters(), 1.0, scaler=scaler, optimizer=opt)
    if result.is_finite():              # one host read; GradScaler does the same
        scaler.step(opt)

Taught in ``02_grad_clipping`` §4.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

__all__ = ["ClipResult", "global_grad_norm", "clip_gradients"]


@dataclass
class ClipResult:
    """Tensors (no host sync yet): the pre-clip norm, whether clipping fired, whether it is finite."""

    norm: torch.Tensor
    clipped: torch.Tensor
    finite: torch.Tensor

    def is_finite(self) -> bool:
        """Read ``finite`` on the host (this is the one sync)."""
        return bool(self.finite)


def global_grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """L2 norm of all gradients seen as one vector (a 0-d tensor; no clipping).

    ``torch.nn.utils.get_total_norm`` takes the gradients themselves, not the parameters.
    """
    return torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], 2.0)


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_norm: float | None,
                   scaler: torch.amp.GradScaler | None = None,
                   optimizer: torch.optim.Optimizer | None = None) -> ClipResult:
    """Unscale (when a scaler is enabled), measure the global norm, clip to ``max_norm``.

    ``max_norm=None`` (or <= 0) only measures. Returns a :class:`ClipResult` of tensors.
    Numerically the same as ``torch.nn.utils.clip_grad_norm_``.
    """
    params = [p for p in parameters if p.grad is not None]
    if scaler is not None and scaler.is_enabled():
        if optimizer is None:
            raise ValueError("使用 GradScaler 时需要传入 optimizer,以便先 unscale_ 再裁剪")
        scaler.unscale_(optimizer)
    if max_norm is not None and max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        clipped = norm > max_norm
    else:
        norm = global_grad_norm(params)
        clipped = torch.zeros((), dtype=torch.bool, device=norm.device)
    return ClipResult(norm=norm.detach(), clipped=clipped, finite=torch.isfinite(norm))
