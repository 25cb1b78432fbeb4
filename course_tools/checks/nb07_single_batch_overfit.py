"""Checks for 07_single_batch_overfit: the overfit loop, diagnosing bugs from curves, the batch-mixing check.

``train_with_bug`` holds the bug gallery (the five training steps the notebook shows); ``mystery_functions`` hands
the learner three of them under opaque names. ``seed`` fixes every model, batch and case, chosen so that each
typical wrong answer fails on every seed (``tests/support/wrong_answers/nb07*.py``, the 50-seed sweep).
``check_diagnose`` uses small MLPs with 3 to 100 classes and different label mixes, so no fixed loss threshold
separates the bugs (the start is about ln(classes), re-shuffled labels plateau near the batch labels' entropy, the
softmax-twice floor is ln(e + C - 1) - 1): only the curve's shape and the grad norm tell them apart. Its curves
and ``check_overfit_one_batch``'s reference Adam run are computed once per seed and cached. Example (in a check cell)::

    from course_tools.checks.nb07_single_batch_overfit import check_diagnose
    check_diagnose(diagnose)
"""
from __future__ import annotations

import contextlib
import functools
import math
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import call_learner, exercise_check, expect, fail, passed, seed_cpu
from course_utils.clipping import global_grad_norm
from course_utils.debug import batch_mixing as reference_mixing
from course_utils.debug import overfit_one_batch as reference_overfit

__all__ = ["BUGS", "DIAGNOSE_CASES", "Curve", "train_with_bug", "mystery_functions", "diagnose_curves",
           "MIXING_CASES", "mixing_model", "check_overfit_one_batch", "check_diagnose", "check_batch_mixing", "HINTS"]


BUGS = ("healthy", "shuffled_labels", "detached", "wrong_loss", "lr_too_small")

# (bug, batch size, classes, label values drawn in the batch). Chosen against fixed loss thresholds:
# 3 classes put lr_too_small's flat line (ln 3 = 1.10) inside wrong_loss's range at 10 classes;
# two label values put the re-shuffled plateau near ln 2 = 0.69, below wrong_loss's floor at 10
# classes (1.46); 50 classes put wrong_loss's floor (2.87) above every plateau at 10 classes;
# healthy runs start near ln 100 = 4.6 or ln 10 and end near 0 with a small grad norm.
DIAGNOSE_CASES = (
    ("healthy", 32, 10, 10),
    ("healthy", 16, 100, 100),
    ("shuffled_labels", 32, 10, 2),
    ("shuffled_labels", 16, 100, 100),
    ("detached", 16, 3, 3),
    ("detached", 32, 50, 50),
    ("wrong_loss", 32, 50, 50),
    ("wrong_loss", 16, 3, 3),
    ("lr_too_small", 16, 3, 3),
    ("lr_too_small", 32, 50, 50),
)
_FEATURES, _HIDDEN, _STEPS = 32, 64, 100


def train_with_bug(bug: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 100,
                   lr: float = 3e-3, seed: int = 0) -> tuple[list[float], list[float]]:
    """Overfit ``(x, y)`` with one of ``BUGS`` injected; returns (losses, pre-step grad norms).

    ``shuffled_labels`` draws a new permutation of the labels at every step (``seed`` fixes
    them): the loss cannot fall. A misalignment fixed once (the same wrong labels every step)
    is memorised like correct labels; the notebook shows both.
    """
    if bug not in BUGS:
        raise ValueError(f"未知的 bug {bug!r};可选: {BUGS}")
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * 1e-3 if bug == "lr_too_small" else lr)
    model.train()
    losses, norms = [], []
    for _ in range(steps):
        targets = y[torch.randperm(len(y), generator=g).to(y.device)] if bug == "shuffled_labels" else y
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


@contextlib.contextmanager
def _one_thread():
    # The check's models are tiny: one thread is fastest, and much steadier on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _mlp(classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(_FEATURES, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, classes))


@dataclass(frozen=True)
class Curve:
    """One hidden training run of ``check_diagnose``."""

    bug: str
    classes: int
    losses: tuple[float, ...]
    norms: tuple[float, ...]


@functools.lru_cache(maxsize=64)
def diagnose_curves(seed: int = 1234) -> tuple[Curve, ...]:
    """The runs of ``DIAGNOSE_CASES`` for ``seed`` (models, batches and order all fixed by it)."""
    rng = np.random.default_rng(seed)
    curves = []
    with torch.random.fork_rng(devices=[]), _one_thread():  # leave the learner's global RNG alone
        for bug, n, classes, drawn in DIAGNOSE_CASES:
            case_seed = int(rng.integers(2**31 - 1))
            g = torch.Generator().manual_seed(case_seed)
            x = torch.randn(n, _FEATURES, generator=g)
            y = torch.randint(0, drawn, (n,), generator=g)
            seed_cpu(case_seed + 1)
            losses, norms = train_with_bug(bug, _mlp(classes), x, y, steps=_STEPS, seed=case_seed + 2)
            curves.append(Curve(bug, classes, tuple(losses), tuple(norms)))
    order = rng.permutation(len(curves))
    return tuple(curves[i] for i in order)


_WHY = {
    "healthy": "loss 降到接近 0:背下来了;grad norm 随之变小是正常的,不是梯度断了",
    "shuffled_labels": "最后几十步 loss 一步一跳;它停在哪个高度取决于这批标签的分布,不是一个固定值",
    "detached": "grad norm 每一步都恰好是 0:梯度没有到达任何参数",
    "wrong_loss": "loss 平滑地降到一个高于 0 的平台后不再动;平台在下界 ln(e+C−1)−1 之上,随类别数变化",
    "lr_too_small": "grad norm 正常、不为 0,但 loss 相对初始值几乎没降:梯度在,步子太小",
}


def _hint(curve: Curve) -> str:
    losses = np.asarray(curve.losses)
    shape = (f"这条曲线: {curve.classes} 类,初始 loss {losses[0]:.2f}(≈ ln {curve.classes} = "
             f"{math.log(curve.classes):.2f}),最后 10 步平均 {losses[-10:].mean():.3g},grad norm 最大 "
             f"{max(curve.norms):.3g}。{_WHY[curve.bug]}")
    if curve.classes != 10:
        shape += ";别用按 10 类定的 loss 阈值,看相对初始值的下降、尾部的抖动和 grad norm"
    return shape


@exercise_check
def check_diagnose(diagnose: Callable, seed: int = 1234) -> None:
    """``diagnose(losses, grad_norms)`` must name the bug of each hidden run (ten runs, fixed by ``seed``)."""
    curves = diagnose_curves(seed)
    for i, curve in enumerate(curves, 1):
        answer = call_learner(diagnose, list(curve.losses), list(curve.norms))
        expect(isinstance(answer, str) and answer in BUGS, f"返回 {BUGS} 之一", f"{answer!r}")
        expect(answer == curve.bug, f"第 {i} 条隐藏的训练曲线诊断为 {curve.bug!r}", f"{answer!r}", _hint(curve))
    passed(f"{len(curves)} 条隐藏的训练曲线(3 到 100 类,顺序打乱)全部诊断正确")


_OVERFIT_LR, _COMPARED = 5e-3, 20  # check_overfit_one_batch's learning rate, and the steps compared with Adam's


def _overfit_case(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and batch of ``check_overfit_one_batch`` for ``seed`` (the learner's global RNG left alone)."""
    with torch.random.fork_rng(devices=[]):
        seed_cpu(seed)
        model = _mlp(10)
        g = torch.Generator().manual_seed(seed + 1)
        return model, torch.randn(16, _FEATURES, generator=g), torch.randint(0, 10, (16,), generator=g)


@functools.lru_cache(maxsize=64)
def _reference_losses(seed: int) -> tuple[float, ...]:
    """The reference Adam run's first losses on ``_overfit_case(seed)``: computed once per seed."""
    model, x, y = _overfit_case(seed)
    with torch.random.fork_rng(devices=[]), _one_thread():
        return tuple(reference_overfit(model, x, y, steps=_COMPARED, lr=_OVERFIT_LR))


@exercise_check
def check_overfit_one_batch(overfit_one_batch: Callable, seed: int = 1234) -> None:
    """The learner's loop must train the given model in place with Adam(lr) until the batch is memorised.

    The first losses are compared with the reference Adam run from the same initial weights, so a
    loop that forgets ``zero_grad``, builds a new optimizer each step, ignores ``lr`` or uses
    another optimizer fails even when it memorises the batch in the end. ``lr`` is not the
    default, so a hard-coded learning rate is caught as well.
    """
    steps, lr, compared = 80, _OVERFIT_LR, _COMPARED
    model, x, y = _overfit_case(seed)
    reference = _reference_losses(seed)
    with _one_thread():
        losses = call_learner(overfit_one_batch, model, x, y, steps=steps, lr=lr)
    expect(isinstance(losses, (list, tuple)) and len(losses) == steps, f"返回长度为 {steps} 的 loss 列表",
           f"{type(losses).__name__} 长度 {len(losses) if hasattr(losses, '__len__') else '?'}",
           "循环 range(steps),每步 append 一次")
    bad = next((v for v in losses if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and math.isfinite(v))), None)
    expect(bad is None, "列表里是有限的 Python float", f"{type(bad).__name__}: {bad!r}",
           "记录 loss.item(),不是 loss 张量本身")
    if not math.isclose(losses[0], reference[0], rel_tol=1e-4, abs_tol=1e-6):
        fail(f"第 1 个 loss 是模型在这批数据上、更新之前的 loss {reference[0]:.4f}", f"{losses[0]:.4f}",
             "先算 loss 并记录,再 backward 和 step;不要换数据,也不要在更新之后重新算 loss")
    for k in range(1, compared):
        if not math.isclose(losses[k], reference[k], rel_tol=1e-3, abs_tol=1e-5):
            fail(f"和参考的 Adam(lr={lr}) 训练一致:第 {k + 1} 步 loss {reference[k]:.4f}", f"{losses[k]:.4f}",
                 "每步都 zero_grad(否则梯度累加)、优化器只在循环外建一次、用 torch.optim.Adam 和传入的 lr")
    with torch.no_grad():
        final = F.cross_entropy(model(x), y).item()
    expect(final < 0.05, "训练后传入的 model 在这个 batch 上的 loss < 0.05(就地训练它)", f"{final:.4f}",
           "训练的必须是传入的 model 本身,不要复制一份或新建模型")
    expect(losses[-1] < 0.1, "返回的最后一个 loss 接近 0", f"{losses[-1]:.4f}")
    passed(f"{steps} 步把一个 batch 的 loss 从 {losses[0]:.3f} 压到 {losses[-1]:.4f},前 {compared} 步与参考的 Adam 一致")


_MIX_FEATURES = 16


class _PairMix(nn.Module):
    """An MLP whose reshape after a transpose puts half of each sample's features into its neighbour's row."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(_MIX_FEATURES, _HIDDEN), nn.Linear(_HIDDEN, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.last(h.reshape(len(h) // 2, 2, -1).transpose(1, 2).reshape(len(h), -1))


class _FaintLeak(nn.Module):
    """An MLP that subtracts a thousandth of the batch mean: every sample depends, faintly, on all the others."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(_MIX_FEATURES, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x - 1e-3 * x.mean(dim=0, keepdim=True))


# (case, the mode the model is handed over in, whether i is passed): the order in which a wrong answer fails
MIXING_CASES = (("clean", "train", True), ("batchnorm", "train", True), ("pairs", "eval", True),
                ("pairs", "eval", False), ("faint", "train", True))
_MIX_WHAT = {
    "clean": ("样本之间互不相连的 MLP", "只对样本 i 的输出求和(model(副本)[i].sum()),不是整个 batch;结果里不含 i 自己"),
    "batchnorm": ("带 BatchNorm、以训练模式传入的 MLP", "训练模式的 BatchNorm 用整个 batch 的统计量,天然混样本:先切到 eval 模式"),
    "pairs": ("把相邻两个样本混在一起的模型", "看每个样本那一行梯度里有没有不为 0 的元素;grad[j] is not None 永远成立"),
    "faint": ("只有极弱跨样本依赖的模型(梯度远小于 1e-3)", "任何不为 0 的梯度都算,不要用容差(例如 > 1e-3)"),
}


def mixing_model(case: str, seed: int) -> nn.Module:
    """The model of one of ``MIXING_CASES`` (weights fixed by ``seed``; the global RNG left alone)."""
    with torch.random.fork_rng(devices=[]):
        seed_cpu(seed)
        if case == "pairs":
            return _PairMix()
        if case == "faint":
            return _FaintLeak()
        norm = [nn.BatchNorm1d(_HIDDEN)] if case == "batchnorm" else []
        return nn.Sequential(nn.Linear(_MIX_FEATURES, _HIDDEN), *norm, nn.ReLU(), nn.Linear(_HIDDEN, 10))


def _shown(samples: set[int]) -> str:
    return "{" + ", ".join(map(str, sorted(samples))) + "}" if samples else "set()"


def _mixing_side_effects(model: nn.Module, training: bool, x: torch.Tensor, before: torch.Tensor) -> None:
    expect(model.training == training, f"调用之后模型仍是调用前的模式(training={training})",
           f"training={model.training}", "先记下 model.training,最后恢复它;不要无条件地 model.train() 或留在 eval 模式")
    expect(not x.requires_grad and x.grad is None and torch.equal(x, before), "调用者的 x 不被改动(不需要梯度,值不变)",
           f"x.requires_grad={x.requires_grad}", "对 x 的副本(x.detach().clone())设 requires_grad,不要对 x 本身")
    left = [name for name, p in model.named_parameters() if p.grad is not None]
    expect(not left, "模型参数上不留下 .grad", f"{left[:2]} 有 .grad",
           "用 torch.autograd.grad 只对输入副本求梯度;用了 backward 就要把参数的 .grad 清回 None")


@exercise_check
def check_batch_mixing(batch_mixing: Callable, seed: int = 1234) -> None:
    """``batch_mixing(model, x, i=0)`` must return the samples ``j != i`` whose input reaches output ``i``.

    Five calls, fixed by ``seed``: a clean MLP, a BatchNorm MLP handed over in training mode (mixing only
    in that mode, so the answer is the empty set), a model that mixes neighbouring pairs (handed over in
    eval mode, once with ``i`` and once with the default), and a faint leak (a gradient far below 1e-3 on
    every other sample). After each call the model's mode, the caller's ``x`` and the parameters' ``.grad``
    must be as they were.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.choice([8, 10, 12]))
    for k, (case, mode, pass_i) in enumerate(MIXING_CASES):
        model = mixing_model(case, seed + k)
        model.train(mode == "train")
        i = int(rng.integers(1, n - 1)) if pass_i else 0
        g = torch.Generator().manual_seed(seed + 100 + k)
        x = torch.randn(n, _MIX_FEATURES, generator=g)
        before = x.clone()
        expected = reference_mixing(model, x, i)
        with _one_thread():
            found = call_learner(batch_mixing, model, x, i) if pass_i else call_learner(batch_mixing, model, x)
        what, why = _MIX_WHAT[case]
        expect(isinstance(found, (set, frozenset)) and all(type(j) is int for j in found),
               "返回 Python int 组成的 set", f"{type(found).__name__}: {found!r}"[:80], "例如 {j for j in ... if ...}")
        expect(found == expected, f"{what},{n} 个样本、i={i}:返回 {_shown(expected)}", _shown(found), why)
        _mixing_side_effects(model, mode == "train", x, before)
    passed(f"{len(MIXING_CASES)} 个模型(干净、BatchNorm、两两混合、极弱依赖)的跨样本依赖都判断正确,没有副作用")


HINTS: dict[str, tuple[str, ...]] = {
    "check_overfit_one_batch": (
        "单 batch 过拟合:同一批数据反复训练,没有 bug 的循环能把 loss 压到接近 0。检查拿你的前 20 步 loss "
        "和同样初始权重下的标准 Adam 循环逐步比较,所以只是「最后降下来了」不够,每一步都得是标准的一步",
        "07 的「1. 朴素写法:同一个 batch 喂 200 次」一节就是这个循环的样子;「练习 1:写出 overfit_one_batch」"
        "的说明列出了要返回什么",
        "常错的几处:优化器建在循环里面(每步新建,Adam 的状态被清零),或者写死了学习率而没用参数 lr;"
        "忘了每步清空梯度;记录的是 loss 张量而不是它的数值(.item());loss 要在这一步更新之前算好并记下;"
        "训练的必须是传入的 model,不要复制一份",
    ),
    "check_diagnose": (
        "几种 bug 靠曲线的形状区分,而不是 loss 的绝对大小:初始 loss 约为 ln(类别数),而隐藏曲线的类别数从 3 到 100 都有,"
        "固定的 loss 阈值一定会在某个类别数上判错。grad norm 是另一半证据:梯度断了和步子太小,loss 看起来都不降",
        "07 的「2. 常见 bug 图鉴(bug gallery):每种 bug 的曲线长什么样」一节画了每种 bug 的 loss 和 grad norm;"
        "mystery_functions 给了三个可以先练手的",
        "常错的是照着 10 类的数字定阈值(例如「最后的 loss 高于某个数就是 softmax 用了两次」):换成相对初始 loss 的下降比例"
        "和尾部的抖动;判断的顺序也要紧:先看 grad norm 是否恰好为 0,再看是否已经背下来,"
        "最后分一步一跳的平台、平滑的平台和几乎不降的直线",
    ),
    "check_batch_mixing": (
        "batch 依赖检查:样本 i 的输出只该依赖它自己的输入,所以它对其他样本输入的梯度必须恰好为 0;"
        "检查还要求它不改变模型的模式、不改动传入的 x、不在参数上留下梯度",
        "07 的「0.3 batch 依赖检查」一节先用朴素代码做了一遍,又说明了 BatchNorm 为什么要在 eval 模式下查;"
        "「练习 3:写出 batch_mixing」列出了全部要求",
        "常错的几处:对整个 batch 的输出求和而不是只对样本 i;结果里包含了 i;用容差判断「为 0」;"
        "忘了切到 eval 模式,或切过去之后没恢复(或无条件切回训练模式);对传入的 x 本身调用了 requires_grad_;"
        "用 backward 后参数上留下了 .grad",
    ),
}
