"""EMA of weights: train one copy, evaluate the other.

After every optimizer step the shadow copy moves a little towards the live weights:
``ema = decay * ema + (1 - decay) * w``. With decay 0.999 it averages roughly the
last 1 / (1 - decay) = 1000 steps of the noisy SGD trajectory. Whether the average
evaluates better than the live weights depends on the run: measure it over several
seeds (``03_ema`` §4 does; on small runs the spread can cover the effect).

Pitfalls handled here:
- BatchNorm running statistics are buffers, not parameters. They are copied from
  the live model on every update (``num_batches_tracked`` is an integer and must
  never be averaged). Copied statistics belong to the LIVE weights, not to the
  averaged ones: for a BN model, recompute them for the EMA weights with
  ``torch.optim.swa_utils.update_bn`` before an evaluation that matters
  (``03_ema`` §3 measures the difference).
- With ``warmup=False`` this equals ``AveragedModel(model,
  multi_avg_fn=get_ema_multi_avg_fn(decay))``: the first ``update`` copies the
  weights, later ones lerp with ``torch._foreach_lerp_`` (one fused op, no per-tensor loop).
- Short runs: decay 0.999 needs ~1000 steps to forget the start. ``warmup=True``
  uses ``min(decay, (1 + n) / (10 + n))`` so the average follows early training.

Example::

    ema = EMA(model, decay=0.999)
    for x, y in loader:
        ...; opt.step(); ema.update(model)
    evaluate(ema.module)                 # or: with ema.swapped_into(model): evaluate(model)
    ckpt = {"model": model.state_dict(), "ema": ema.state_dict()}

Taught in ``03_ema`` §1–3.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    """An exponential moving average of a model's parameters (buffers copied)."""

    def __init__(self, model: nn.Module, decay: float = 0.999, warmup: bool = False) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay 应在 [0, 1) 之间,实际是 {decay}")
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    def current_decay(self) -> float:
        """The decay the next ``update`` uses: 0.0 for the first one (it copies the weights), then
        ``decay``, or with ``warmup=True`` the smaller ``(1 + n) / (10 + n)`` while that is below it."""
        if self.num_updates == 0:
            return 0.0
        if self.warmup:
            return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        return self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``; call once after each optimizer step."""
        ema_params = list(self.module.parameters())
        live_params = [p.detach() for p in model.parameters()]
        if self.num_updates == 0:
            torch._foreach_copy_(ema_params, live_params)
        else:
            weight = 1.0 - self.current_decay()
            # the fused lerp takes float/complex tensors only (as in torch.optim.swa_utils)
            lerp = [(e, p) for e, p in zip(ema_params, live_params) if e.is_floating_point() or e.is_complex()]
            if lerp:
                torch._foreach_lerp_([e for e, _ in lerp], [p for _, p in lerp], weight)
            for e, p in zip(ema_params, live_params):
                if not (e.is_floating_point() or e.is_complex()):
                    e.copy_(p)  # an integer parameter cannot be averaged: follow the live model
        for ema_buf, buf in zip(self.module.buffers(), model.buffers()):
            ema_buf.copy_(buf)
        self.num_updates += 1

    @contextlib.contextmanager
    def swapped_into(self, model: nn.Module) -> Iterator[nn.Module]:
        """Temporarily load the EMA weights into ``model`` (e.g. to evaluate it), then restore."""
        backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.module.state_dict())
        try:
            yield model
        finally:
            model.load_state_dict(backup)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "decay": self.decay, "warmup": self.warmup,
                "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.decay = state["decay"]
        self.warmup = state["warmup"]
        self.num_updates = state["num_updates"]
