"""Checks for 05_reproducibility.ipynb: ``set_seed`` must seed all four generators."""
from __future__ import annotations

import random
import secrets
from typing import Any, Callable

import numpy as np
import torch

from course_tools.checks import call_learner, expect, passed


__all__ = ["check_set_seed"]


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


def check_set_seed(set_seed: Callable[[int], None]) -> None:
    """``set_seed(s)`` twice gives the same draws from python random, numpy, torch and CUDA;
    another seed gives other draws; ``torch.cuda.manual_seed_all(s)`` is reached (recorded
    by a temporary wrapper, so the check also works on a machine without a GPU)."""
    rng = np.random.default_rng(secrets.randbits(64))
    seed_a, seed_b = (int(s) for s in rng.choice(2**31 - 1, size=2, replace=False))
    original = torch.cuda.manual_seed_all
    calls: list[int] = []

    def recording(seed: int) -> None:
        calls.append(int(seed))
        original(seed)

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
               f"{first[name]} 与 {second[name]} 不同(这个生成器没有被设种子)")
    same = [name for name in first if first[name] == other[name]]
    expect(not same, f"set_seed({seed_a}) 与 set_seed({seed_b}) 抽到不同的数",
           f"{', '.join(same)} 两次相同(种子参数没有被用上?)")
    expect(seed_a in cuda_calls, f"调用了 torch.cuda.manual_seed_all({seed_a})(所有 GPU 的生成器)",
           f"记录到的调用 {cuda_calls or '无'}")
    passed("set_seed 设好了 python random、numpy、torch CPU 和 torch.cuda 四个生成器")
