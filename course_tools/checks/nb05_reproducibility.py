"""Checks for 05_reproducibility.ipynb: ``set_seed`` must seed all four generators.

The check is deterministic: both seeds it passes and the scrambling in between come
from its ``seed`` argument. A wrong answer (a generator left out, a constant seed, a
new ``np.random.default_rng`` instead of the global RNG, CUDA not seeded) fails for
every value of ``seed``; ``tests/test_exercise_sweeps.py`` sweeps 50 of them.

Example::

    check_set_seed(set_seed)
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch

from course_tools.checks import call_learner, exercise_check, expect, passed


__all__ = ["check_set_seed", "HINTS"]

_FAILURE_HINTS = {
    "python random": "python 的 random 模块要用 random.seed(seed);random.Random(seed) 只是新建了一个对象",
    "numpy (np.random)": "全局 RNG 要用 np.random.seed(seed);np.random.default_rng(seed) 只是新建一个生成器",
    "torch CPU": "torch.manual_seed(seed)",
    "torch.cuda": "torch.cuda.manual_seed_all(seed) 给每块 GPU 设种子",
}


def _draw() -> dict[str, Any]:
    """One value from each global generator (and from every CUDA device when there is one)."""
    out = {
        "python random": random.random(),
        "numpy (np.random)": float(np.random.rand()),
        "torch CPU": float(torch.rand(())),
    }
    if torch.cuda.is_available():
        out["torch.cuda"] = [float(torch.rand((), device=f"cuda:{i}")) for i in range(torch.cuda.device_count())]
    return out


def _scramble(rng: np.random.Generator) -> None:
    """Move every generator to an unrelated state, so leftover state cannot fake a pass."""
    seed = int(rng.integers(0, 2**31 - 1))
    random.seed(seed + 1)
    np.random.seed(seed + 2)
    torch.manual_seed(seed + 3)


@exercise_check
def check_set_seed(set_seed: Callable[[int], None], seed: int = 1234) -> None:
    """``set_seed(s)`` twice gives the same draws from python random, numpy, torch and CUDA;
    another seed gives other draws; ``torch.cuda.manual_seed_all(s)`` is reached (recorded
    by a temporary wrapper, so the check also works on a machine without a GPU).

    ``seed`` fixes the two seeds passed to the learner's function and the scrambling.
    """
    rng = np.random.default_rng(seed)
    seed_a, seed_b = (int(s) for s in rng.choice(2**31 - 1, size=2, replace=False))
    original = torch.cuda.manual_seed_all
    calls: list[int] = []

    def recording(value: int) -> None:
        calls.append(int(value))
        original(value)

    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    torch.cuda.manual_seed_all = recording
    try:
        _scramble(rng)
        calls.clear()
        call_learner(set_seed, seed_a)
        cuda_calls = list(calls)
        first = _draw()
        _scramble(rng)
        call_learner(set_seed, seed_a)
        second = _draw()
        _scramble(rng)
        call_learner(set_seed, seed_b)
        other = _draw()
    finally:
        torch.cuda.manual_seed_all = original
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
    for name in first:
        expect(first[name] == second[name], f"两次 set_seed({seed_a}) 之后 {name} 抽到相同的数",
               f"{first[name]} 与 {second[name]} 不同:这个生成器没有被设种子", _FAILURE_HINTS[name])
    same = [name for name in first if first[name] == other[name]]
    expect(not same, f"set_seed({seed_a}) 与 set_seed({seed_b}) 抽到不同的数",
           f"{', '.join(same)} 两次相同", "种子参数没有被用上:是不是写死了一个常数?")
    expect(seed_a in cuda_calls, f"调用了 torch.cuda.manual_seed_all({seed_a})(所有 GPU 的生成器)",
           f"记录到的调用 {cuda_calls or '无'}", _FAILURE_HINTS["torch.cuda"] + ";只给 CPU 生成器设种子时 GPU 上的 Dropout 不受控")
    passed("set_seed 设好了 python random、numpy、torch CPU 和 torch.cuda 四个生成器")


HINTS: dict[str, tuple[str, ...]] = {
    "check_set_seed": (
        "一次训练里有四个互不相干的全局随机数生成器:python 的 random、numpy 的全局 np.random、torch 的 CPU 生成器、"
        "每块 GPU 的 CUDA 生成器。set_seed 要让四个都从传入的同一个种子开始(torch.manual_seed 一次就管了 torch 的 CPU "
        "生成器和每块 GPU 的生成器);漏掉一个,那一路的随机数(打乱、数据增强、Dropout)就不受控,而且不会有任何报错",
        "05 的「1. 四个随机数生成器」一节列出了训练里谁在用哪个生成器,并演示了只漏掉 numpy 时两次运行怎样分叉",
        "常错的是 numpy 那一行:np.random.default_rng 新建一个独立的生成器,全局的 np.random 并没有被设种子"
        "(random.Random 同理,只是新建了一个对象);其次是只给 torch 的默认 CPU 生成器对象设了种子:"
        "torch.manual_seed 会顺带给所有 GPU 设种子(torch/random.py),生成器对象自己的 manual_seed 不会,"
        "那就再写一行给所有卡一起设种子的函数(没有 GPU 的机器上也无害);最后,种子要用参数本身,不要写死一个常数",
    ),
}
