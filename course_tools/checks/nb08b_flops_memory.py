"""Checks for 08b_flops_memory.ipynb: a training step's FLOPs by hand, and its memory budget.

``check_step_flops`` compares the learner's hand count of one training step of ``exercise_model(image_size)``
with ``FlopCounterMode`` (1% tolerance) on eight (batch, image size) cases, odd sizes included so that the
stride's rounding matters. ``check_peak_memory`` compares the learner's budget of one AdamW step of
``exercise_mlp(widths)`` with the four parts counted on the real tensors after one step
(``course_utils.estimate.measured_memory``; 10% tolerance) on seven configurations whose activations are 36–48%
of the total, so that each forgotten part misses by more than 10% (and the hints naming them stay apart).

Example (in a check cell)::

    from course_tools.checks.nb08b_flops_memory import check_step_flops
    check_step_flops(step_flops)
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Callable

import numpy as np
import torch
from torch import nn

from course_tools.checks import call_learner, exercise_check, expect, fail, passed, seed_cpu
from course_utils.estimate import MemoryBudget, StepFlops, measured_memory, training_flops

__all__ = ["FLOPS_REL_TOL", "exercise_model", "check_step_flops", "MEMORY_REL_TOL", "exercise_mlp",
           "check_peak_memory", "HINTS"]


FLOPS_REL_TOL = 0.01


def exercise_model(image_size: int) -> nn.Sequential:
    """The exercise's model: conv 3→8 (3×3, padding 1), conv 8→16 (3×3, stride 2, padding 1), linear → 10."""
    side = (image_size + 2 * 1 - 3) // 2 + 1
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * side * side, 10))


def _flops_hint(ratio: float, forward_share: float) -> str:
    """A hint naming the typical mistake behind ``answer / reference == ratio``."""
    def near(target: float) -> bool:
        return abs(math.log(ratio / target)) < 0.005

    if near(0.5):
        return "(小了一半:一次乘加(multiply-add)是 2 个 FLOP)"
    if near(forward_share) or near(forward_share / 2):
        return "(像是只算了前向:反向还要算权重梯度和输入梯度,约为前向的 2 倍)"
    if near(3 * forward_share):
        return "(多了第一层的输入梯度:输入是图片,不需要梯度,第一层反向只算权重梯度)"
    return "(逐层检查输出边长 (H + 2·padding − k) // stride + 1,以及每个输出读了多少个输入)"


@functools.lru_cache(maxsize=None)
def _counted_flops(batch_size: int, image_size: int) -> StepFlops:
    """FlopCounterMode's count of one training step of ``exercise_model`` (once per shape)."""
    with torch.random.fork_rng(), torch.device("meta"):   # shapes only: no memory, no compute, no RNG drawn
        return training_flops(exercise_model(image_size), torch.randn(batch_size, 3, image_size, image_size))


@exercise_check
def check_step_flops(step_flops: Callable[[int, int], float], seed: int = 1234) -> None:
    """Compare ``step_flops(batch_size, image_size)`` (forward + backward of ``exercise_model``) with FlopCounterMode."""
    rng = np.random.default_rng(seed)
    cases = [(32, 32)] + [(int(rng.integers(1, 65)), int(rng.integers(9, 49))) for _ in range(6)]
    cases.append((int(rng.integers(1, 65)), 2 * int(rng.integers(5, 24)) + 1))   # one odd size for sure
    for batch_size, image_size in cases:
        args = f"step_flops({batch_size}, {image_size})"
        got = call_learner(step_flops, batch_size, image_size)
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            fail(f"{args} 返回一个数(FLOP)", f"{type(got).__name__} {got!r}"[:80], "返回 FLOP 数本身")
        want = _counted_flops(batch_size, image_size)
        value = float(got)
        ok = math.isfinite(value) and math.isclose(value, want.total, rel_tol=FLOPS_REL_TOL)
        hint = _flops_hint(value / want.total, want.forward / want.total) if not ok and value > 0 and math.isfinite(value) else ""
        expect(ok, f"{args} ≈ {want.total:,} FLOP(FlopCounterMode,相对误差 {FLOPS_REL_TOL:.0%} 以内)", f"{value:,.0f}{hint}")
    passed(f"step_flops 在 {len(cases)} 组 (batch, 图片边长) 上与 FlopCounterMode 一致(前向 + 反向,误差 {FLOPS_REL_TOL:.0%} 以内)")


MEMORY_REL_TOL = 0.10


def exercise_mlp(widths: list[int]) -> nn.Sequential:
    """The memory exercise's model: ``Linear(widths[0], widths[1])``, ReLU, ..., ``Linear(widths[-2], widths[-1])``."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


@functools.lru_cache(maxsize=None)
def _measured(widths: tuple[int, ...], batch_size: int) -> MemoryBudget:
    """One AdamW step of ``exercise_mlp(widths)`` on a batch, its memory counted tensor by tensor (shapes only matter)."""
    with torch.random.fork_rng():
        seed_cpu(0)
        model = exercise_mlp(list(widths))
        x, y = torch.randn(batch_size, widths[0]), torch.randint(0, widths[-1], (batch_size,))
        return measured_memory(model, torch.optim.AdamW(model.parameters()), x, y)


def _memory_cases(seed: int) -> list[tuple[list[int], int]]:
    """Seven (widths, batch) configurations: activations 36–48% of the total, inputs and logits small beside them."""
    rng = np.random.default_rng(seed)
    cases = []
    for depth in [1, 2, 3, 1, 2, 3, int(rng.integers(1, 4))]:
        hidden = [16 * int(rng.integers(4, 21)) for _ in range(depth)]
        hidden[0] = max(hidden[0], 256 - sum(hidden[1:]))   # logits and labels under 5% of the activations
        widths = [int(rng.integers(4, sum(hidden) // 10 + 1)), *hidden, 10]
        n_params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
        share = float(rng.uniform(0.36, 0.48))   # activations / total
        cases.append((widths, max(1, round(share / (1 - share) * 16 * n_params / (4 * sum(hidden))))))
    return cases


def _memory_hint(value: float, want: MemoryBudget, batch_size: int) -> str:
    """A hint naming the typical mistake whose result is nearest to ``value`` (within 6%; the cases keep them apart)."""
    w, g, o, a = want.weights, want.grads, want.optimizer_states, want.activations
    mistakes = [
        (w + g + a, "少了优化器状态:AdamW 为每个参数存两个 fp32 动量"),
        (w + g + o / 2 + a, "每个参数少了 4 字节:AdamW 有两个动量(exp_avg 和 exp_avg_sq),梯度也和权重一样大"),
        (w + g + o + a / batch_size, "少了激活值,或者没乘 batch size:前向为反向保存的张量每个样本各一份"),
        (w + g + o + 2 * a, "激活值多算了一遍:ReLU 的输出就是下一层 Linear 的输入,同一块存储只算一次"),
        (want.total / 4, "像是元素个数:要返回字节数,fp32 每个元素 4 字节"),
        (want.total / 2 ** 20, "像是 MiB:要返回字节数"),
        (want.total / 1e6, "像是 MB:要返回字节数"),
    ]
    if value > 0:
        target, text = min(mistakes, key=lambda m: abs(math.log(value / m[0])))
        if abs(math.log(value / target)) < 0.06:
            return f"({text})"
    return "(逐项检查:权重、梯度、优化器状态、激活值,单位都是字节)"


@exercise_check
def check_peak_memory(peak_memory_bytes: Callable[[list[int], int], float], seed: int = 1234) -> None:
    """Compare ``peak_memory_bytes(widths, batch_size)`` with one AdamW step of ``exercise_mlp(widths)``, measured."""
    cases = _memory_cases(seed)
    for widths, batch_size in cases:
        args = f"peak_memory_bytes({widths}, {batch_size})"
        got = call_learner(peak_memory_bytes, list(widths), batch_size)
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            fail(f"{args} 返回一个数(字节)", f"{type(got).__name__} {got!r}"[:80], "返回字节数本身")
        want = _measured(tuple(widths), batch_size)
        value = float(got)
        ok = math.isfinite(value) and math.isclose(value, want.total, rel_tol=MEMORY_REL_TOL)
        hint = _memory_hint(value, want, batch_size) if not ok and math.isfinite(value) else ""
        expect(ok, f"{args} ≈ {want.total:,} 字节(实测一步 AdamW 训练,相对误差 {MEMORY_REL_TOL:.0%} 以内)",
               f"{value:,.0f}{hint}")
    passed(f"peak_memory_bytes 在 {len(cases)} 组 (层宽, batch) 上与实测一致(权重+梯度+AdamW 状态+激活值,"
           f"误差 {MEMORY_REL_TOL:.0%} 以内)")


HINTS: dict[str, tuple[str, ...]] = {
    "check_step_flops": (
        "一层的前向 FLOP = 2 × 输出元素个数 × 每个输出读的输入个数;一次训练步 = 前向 + 反向,"
        "反向要算权重梯度和输入梯度",
        "08b 的「1. 数一次训练步的 FLOP」一节先用 FlopCounterMode 数了一遍,再逐层手算对上",
        "最常错的三处:乘加只算 1 个 FLOP;步长为 2 的那层输出边长没按公式取整;"
        "第一层的输入是图片,反向只有权重梯度那一份",
    ),
    "check_peak_memory": (
        "训练一步至少要同时放下四样东西:权重、梯度、优化器状态、为反向保存的激活值;单位都是字节",
        "08b 的「3. 显存(内存)预算:先预测,再实测」一节把这四项逐项列出,并在本机实测对照",
        "最常错的三处:忘了优化器状态(AdamW 每个参数有两个动量);激活值没乘 batch size;"
        "返回的是元素个数而不是字节数",
    ),
}
