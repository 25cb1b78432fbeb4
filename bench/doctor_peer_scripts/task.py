"""The task every peer script of bench/doctor_peers.py trains: 13's tiny causal LM on its synthetic token stream.

The model and data are the capstone trainer's (``course_tools/lab/train_tiny_lm.py``); the loops, checkpoints
and resumes are each stack's own, written as its users write them.
"""
import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: course_tools without an install
from course_tools.lab.train_tiny_lm import CONTEXT, TinyLM, TokenWindows  # noqa: E402

__all__ = ["CONTEXT", "TinyLM", "TokenWindows", "BATCH", "EPOCHS", "WINDOWS", "command_line", "lm_loss", "lr_factor"]

BATCH, EPOCHS, WINDOWS = 8, 3, 64          # 8 batches per epoch, 24 optimizer steps


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def lr_factor(step: int, total: int, warmup: int = 3) -> float:
    """Linear warm-up, then cosine down to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def command_line(*switches: str) -> argparse.Namespace:
    """``--out FOLDER`` and ``--resume`` (the doctor's ``{out}`` and ``[--resume]``), plus on/off ``switches``."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    for name in ("--resume", *switches):
        p.add_argument(name, action="store_true")
    return p.parse_args()
