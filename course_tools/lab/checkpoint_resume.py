"""The machinery behind the experiments of ``04_checkpoint_resume``: plots, a measurement, the launcher.

Reference machinery, not taught: the notebook keeps visible every line a learner must understand (what a checkpoint
holds, how it is restored, the command line, the kill, the ``--resume``, the comparison) and calls these helpers
for the rest: the curves of sections 1 and 3, the launcher that SIGKILLs the professional script right after an
exact optimizer step (:func:`run_logged`, :func:`wait_for_kill`), an accuracy (section 4), a flipped byte in a
checkpoint (section 5), and a stand-in pretrained model with LoRA adapters (section 7). Example::

    proc = run_logged(command, WORK / "interrupted.log", kill_after=12)
    before_kill = wait_for_kill(proc, run_dir)
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from course_utils import interrupt
from course_utils.data import make_loader
from course_utils.evaluation import evaluate
from course_utils.monitor import read_metrics

__all__ = ["plot_amnesia", "train_records", "run_logged", "wait_for_kill",
           "plot_kill_and_resume", "accuracy", "flip_byte", "pretrained_mlp", "LoRALinear", "add_lora", "train_a_few_steps"]


def plot_amnesia(reference: list[dict], full: list[dict], weights: list[dict], cut: int) -> None:
    """Loss (left) and learning rate (right) per step of the three runs of section 1."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, label in zip(axes, ("loss", "lr"), ("train loss", "learning rate")):
        _ = ax.plot([r["step"] for r in reference], [r[key] for r in reference], color="black", lw=2.5, alpha=0.35,
                    label="uninterrupted")
        _ = ax.plot([r["step"] for r in full], [r[key] for r in full], "--", color="tab:green",
                    label="resumed: full checkpoint")
        _ = ax.plot([r["step"] for r in weights], [r[key] for r in weights], color="tab:red",
                    label="resumed: weights only")
        _ = ax.axvline(cut, color="gray", ls=":")
        _ = ax.set_xlabel("optimizer step")
        _ = ax.set_ylabel(label)
        _ = ax.legend()
    plt.tight_layout()
    plt.show()


def train_records(run_dir: Path) -> list[dict]:
    """The ``train`` records of a run's ``metrics.jsonl`` (none yet: an empty list)."""
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]


def run_logged(command: list[str], log: Path, env: dict[str, str] | None = None,
               kill_after: int | None = None) -> subprocess.Popen:
    """Start ``command`` (``[python, script, ...]``) with stdout and stderr going to ``log``.

    ``kill_after``: the process SIGKILLs itself right after its ``kill_after``-th optimizer step
    (``course_utils.interrupt`` counts torch's ``optimizer.step()`` calls inside it), so the kill
    lands at the same step however busy the machine is; the script itself is unchanged.
    """
    if kill_after is not None:
        command = [command[0], interrupt.__file__, str(kill_after), *command[1:]]
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_for_kill(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> list[dict]:
    """Wait for ``proc`` (started with ``kill_after``) to end; return the train records then on disk.

    The caller's check of ``proc.returncode`` (``-signal.SIGKILL``) says whether it was killed.
    """
    proc.wait(timeout=timeout)
    return train_records(run_dir)


def plot_kill_and_resume(reference: dict[int, float], before_kill: list[dict], resumed: dict[int, float],
                         resume_step: int) -> None:
    """The reference run's loss, the killed run's loss before the kill and after ``--resume``."""
    fig, ax = plt.subplots(figsize=(8, 4))
    _ = ax.plot(list(reference), list(reference.values()), color="black", lw=4, alpha=0.3,
                label="reference (uninterrupted)")
    _ = ax.plot([r["step"] for r in before_kill], [r["loss"] for r in before_kill], "o-", color="tab:red", ms=3,
                label="interrupted run, before kill -9")
    after = [s for s in sorted(resumed) if s > resume_step]
    _ = ax.plot(after, [resumed[s] for s in after], "s--", color="tab:green", ms=3, label="after --resume")
    _ = ax.axvline(resume_step, color="gray", ls=":", label=f"resumed from step {resume_step}")
    _ = ax.set_xlabel("optimizer step")
    _ = ax.set_ylabel("train loss")
    _ = ax.legend()
    plt.show()


def accuracy(model: nn.Module, dataset: Any) -> float:
    """Top-1 accuracy of ``model`` on ``dataset`` (``course_utils.evaluation.evaluate``: the model's mode is kept)."""
    return evaluate(model, make_loader(dataset, 256, shuffle=False), next(model.parameters()).device)["acc"]


def flip_byte(path: Path, tensor: torch.Tensor, offset: int = 5) -> None:
    """Flip one byte inside ``tensor``'s data where it is stored in the checkpoint ``path`` (stored
    uncompressed inside the zip, so its bytes appear as they are)."""
    raw = bytearray(path.read_bytes())
    start = raw.find(tensor.detach().cpu().numpy().tobytes())
    if start < 0:
        raise ValueError(f"the tensor's bytes are not in {path}")
    raw[start + offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def pretrained_mlp(dim: int) -> nn.Sequential:
    """Stands in for "load the pretrained weights": 4 blocks (Linear + GELU) and a head, always the same weights."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(4)], nn.Linear(dim, 10))


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update: ``W x + (alpha / r) * B A x`` (Hu et al. 2021)."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / base.in_features ** 0.5)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))  # starts as a no-op
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale


def add_lora(model: nn.Sequential, rank: int = 8) -> nn.Sequential:
    """Freeze the whole ``model`` (the head included) and wrap the Linear of each block in a ``LoRALinear``."""
    model.requires_grad_(False)
    for block in model:
        if isinstance(block, nn.Sequential):
            block[0] = LoRALinear(block[0], rank)
    return model


def train_a_few_steps(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                      steps: int = 5) -> None:
    """``steps`` plain optimizer steps of cross-entropy on one batch."""
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
