"""The standard debugging moves: sanity-check the start (initial loss, a batch that does not
mix), overfit one batch, look at samples, and the ONE troubleshooting order (标准排查顺序)
that joins them.

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
    assert batch_mixing(model, x, i=3) == set()

The troubleshooting order ``TROUBLESHOOTING`` is the chapter's single source: 07 §2,
the answer of 09's question 6, 10's closing section, GLOSSARY.md and the failure message
of ``debug_overfit.py`` all render it (``troubleshooting_text`` / ``troubleshooting_markdown``).
Walk it from the top; stop at the first step whose symptom you see and clear its first
suspect before going on. Why this order:

1. NaN/inf first: once a value is not finite, every later loss and grad norm is
   meaningless, so nothing below can be read. Its first suspects are precision and lr.
2.-3. Labels, then the loss: both are checked before any training (look at 8 samples
   with their labels; compare the initial loss with ln(C)), and a wrong label mapping
   is the one bug the overfit test below cannot catch (it is memorised like a right one).
4.-6. Then ONE single-batch overfit run, read in the order its curves decide: a jittery
   plateau at the label entropy (inputs and labels not aligned step by step), a grad
   norm of exactly 0 (a cut gradient chain), a normal grad norm with a flat loss (lr too
   small) or a grad norm sliding to 0 (saturation). Bugs before the one hyperparameter:
   fix the code before tuning the learning rate.
7. Throughput last: a data-loading stall makes training slow, not wrong. First right,
   then fast; and for a throughput drop the first suspect is the data loading.

Taught in ``07_single_batch_overfit`` §0–3 (the checks before training: 07 §0; the order itself: 07 §2).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.data import MEAN, STD

__all__ = ["overfit_one_batch", "denormalize", "show_samples", "params_without_grad", "sanity_report",
           "batch_mixing", "TroubleStep", "TROUBLESHOOTING", "troubleshooting_chain", "troubleshooting_text",
           "troubleshooting_markdown"]


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


def batch_mixing(model: nn.Module, x: torch.Tensor, i: int = 0) -> set[int]:
    """The samples ``j != i`` of ``x`` whose input gets a non-zero gradient from the output for sample ``i``.

    Why: every sample's output should depend on its own input only. A ``view`` where a
    ``permute`` was meant, or a reshape across the batch dimension, mixes samples; the model
    still trains and still memorises one batch, so the overfit test cannot catch it and this
    gradient check can (Karpathy's batch-dependency check). It differentiates
    ``model(x)[i].sum()`` with respect to a copy of ``x``: the rows of that gradient other
    than ``i`` must be exactly 0.

    Pitfall: BatchNorm in training mode mixes the batch by design (it normalises with the
    batch's statistics), so the check runs in eval mode and then restores the mode the
    model was in. The caller's ``x`` and the parameters' ``.grad`` are left untouched.

    Example::

        assert batch_mixing(model, x, i=3) == set()

    Taught in ``07_single_batch_overfit`` §0.
    """
    was_training = model.training
    model.eval()
    try:
        leaf = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(model(leaf)[i].sum(), leaf)
    finally:
        model.train(was_training)
    touched = grad.flatten(1).ne(0).any(dim=1)
    return {j for j in range(len(x)) if j != i and bool(touched[j])}


class TroubleStep(NamedTuple):
    """One step of the troubleshooting order (Chinese strings; ``taught_in`` like "07 §2")."""

    symptom: str     # what you see
    suspect: str     # the first suspect, short
    check: str       # the check to run
    taught_in: str   # where the chapter teaches it: "07 §2", "01 §5、02 §2–3" or "09 实验 7"


TROUBLESHOOTING: tuple[TroubleStep, ...] = (
    TroubleStep("loss 或 grad norm 变成 NaN/inf", "精度与学习率",
                "看出现 NaN 之前的 grad norm:先骤升 → 学习率太大或坏 batch(调小学习率、开梯度裁剪);"
                "没有预兆 → 精度(fp16 没配 GradScaler、在低精度里算 log/softmax:先 .float());"
                "关掉 AMP、调小学习率,从上一个检查点复现一次", "01 §5、02 §2–3"),
    TroubleStep("loss 不降,或背下了一个 batch、留出数据上的准确率却偏低", "标签",
                "训练前用 show_samples 看 8 个样本和标签,和可信的参照并排;数一数每类标签的个数。"
                "固定的标签映射错误会被背下来,只有这一步能抓到", "07 §3"),
    TroubleStep("初始 loss 远离 ln(类别数),或 loss 平滑地停在高于 0 的平台", "loss 写法",
                "sanity_report 对照初始 loss 和 ln(类别数);确认传给 cross_entropy 的是 logits,"
                "不是 softmax 之后的概率", "07 §0–2"),
    TroubleStep("单 batch 过拟合时 loss 一步一跳,停在这批标签分布的熵附近", "数据对齐",
                "overfit_one_batch 反复训练同一个 batch,看最后几十步:每一步的标签和输入是否按同一个顺序取"
                "(两次不同的打乱就会错位)", "07 §2"),
    TroubleStep("grad norm 恰好为 0,或有一部分参数从不更新", "梯度链",
                "一次 backward 之后用 params_without_grad 列出没收到梯度的参数;"
                "找 detach、no_grad、转 numpy 再转回", "07 §2"),
    TroubleStep("grad norm 正常、loss 却几乎不动;或 grad norm 一路趋近 0", "学习率与饱和",
                "把日志里记录的 lr 和设计的调度对照(单位写错、预热没结束);"
                "grad norm 趋近 0 时看输出是否贴在 sigmoid/tanh 的饱和区", "07 §2、06 §2、09 实验 7"),
    TroubleStep("吞吐(samples/s)骤降,GPU 利用率低", "数据加载",
                "把每一步的时间拆成“等数据”和“计算”两部分;等数据占大头 → num_workers、磁盘 IO、"
                "pin_memory、CPU 上的数据增强", "06 §3"),
)

_REF = re.compile(r"(\d\d) (?:§\d+(?:–\d+)?|实验 \d+)")


def troubleshooting_chain() -> str:
    """The order in one line: the first suspects joined by arrows."""
    return " → ".join(step.suspect for step in TROUBLESHOOTING)


def troubleshooting_text() -> str:
    """The order as numbered plain text (scripts, CLI messages)."""
    lines = [f"标准排查顺序(从上往下,停在第一条对得上的症状,先排除它的第一嫌疑): {troubleshooting_chain()}"]
    for k, step in enumerate(TROUBLESHOOTING, 1):
        lines.append(f"{k}. {step.suspect}: 症状 {step.symptom};怎么查: {step.check}(见 {step.taught_in})")
    return "\n".join(lines)


def _notebook_files() -> dict[str, str]:
    """"07" -> "07_single_batch_overfit.ipynb", from the notebooks next to this package."""
    root = Path(__file__).resolve().parent.parent
    found: dict[str, str] = {}
    for folder in ("notebooks", "solutions"):
        for path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            found.setdefault(path.name[:2], path.name)
    return found


def troubleshooting_markdown(link_prefix: str = "") -> str:
    """The order as a numbered Markdown list, each "taught in" linked to its notebook.

    ``link_prefix`` is put before each notebook file name: "" from a notebook,
    "notebooks/" from a file at the repository root.
    """
    files = _notebook_files()

    def link(match: re.Match) -> str:
        name = files.get(match.group(1))
        return f"[{match.group(0)}]({link_prefix}{name})" if name else match.group(0)

    lines = [f"**标准排查顺序**:{troubleshooting_chain()}。从上往下,停在第一条对得上的症状,先排除它的第一嫌疑。", ""]
    for k, step in enumerate(TROUBLESHOOTING, 1):
        lines.append(f"{k}. **{step.suspect}**:{step.symptom}。怎么查:{step.check}。"
                     f"(见 {_REF.sub(link, step.taught_in)})")
    return "\n".join(lines)
