"""Checks for 06_monitoring.ipynb: a loss-spike detector on random training curves."""
from __future__ import annotations

import math
import secrets
from typing import Callable, Sequence

import numpy as np

from course_tools.checks import call_learner, expect, passed


__all__ = ["training_curve", "inject_spikes", "check_find_spikes"]


def training_curve(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """A noisy, decreasing loss curve: fast drop, slow tail, ~4% multiplicative noise."""
    t = np.arange(n)
    tau = rng.uniform(15, 60)
    floor = rng.uniform(0.1, 0.4)
    clean = scale * (floor + (1 - floor) * np.exp(-t / tau))
    return clean * (1 + rng.normal(0, 0.04, n)), clean


def inject_spikes(rng: np.random.Generator, values: np.ndarray, clean: np.ndarray, k: int,
                  start: int = 60, gap: int = 25) -> tuple[np.ndarray, list[int]]:
    """Put ``k`` spikes (3x to 8x the local level) at random, well separated positions."""
    n = len(values)
    while True:
        where = np.sort(rng.choice(np.arange(start, n), size=k, replace=False))
        if np.all(np.diff(where) >= gap):
            break
    out = values.copy()
    out[where] = clean[where] * rng.uniform(3.0, 8.0, size=k)
    return out, [int(i) for i in where]


def _as_indices(found, n: int) -> list[int]:
    try:
        idx = sorted({int(i) for i in found})
    except TypeError:
        raise AssertionError(f"期望返回尖峰下标的列表;实际返回 {type(found).__name__}") from None
    expect(all(0 <= i < n for i in idx), f"下标在 0..{n - 1} 之间", f"{idx[:8]}")
    return idx


def check_find_spikes(find_spikes: Callable[[Sequence[float]], Sequence[int]]) -> None:
    """No alarm on clean curves of very different scales; every injected spike, NaN and inf found."""
    rng = np.random.default_rng(secrets.randbits(64))
    scales = [float(rng.uniform(0.01, 0.05)), float(rng.uniform(1.0, 3.0)), float(rng.uniform(8.0, 20.0))]
    for scale in scales:
        values, clean = training_curve(rng, int(rng.integers(200, 400)), scale)
        found = _as_indices(call_learner(find_spikes, values.tolist()), len(values))
        expect(found == [], f"初始 loss ≈ {scale:.3g} 的正常曲线(只有 4% 噪声)不报警",
               f"报警了 {len(found)} 次,例如下标 {found[:5]}")
    for scale in scales:
        values, clean = training_curve(rng, int(rng.integers(200, 400)), scale)
        spiked, where = inject_spikes(rng, values, clean, int(rng.integers(2, 5)))
        found = _as_indices(call_learner(find_spikes, spiked.tolist()), len(spiked))
        missed = sorted(set(where) - set(found))
        extra = sorted(set(found) - set(where))
        expect(not missed, f"抓到注入的尖峰 {where}(初始 loss ≈ {scale:.3g})", f"漏掉了 {missed}")
        expect(not extra, f"只报注入的尖峰 {where}", f"还误报了 {extra[:5]}")
    values, clean = training_curve(rng, 200, float(rng.uniform(1.0, 3.0)))
    bad = sorted(int(i) for i in rng.choice(np.arange(40, 200), size=2, replace=False))
    values[bad[0]], values[bad[1]] = math.nan, math.inf
    found = _as_indices(call_learner(find_spikes, values.tolist()), len(values))
    expect(found == bad, f"NaN/inf 也算尖峰,且不影响后面的判断:{bad}", f"{found[:8]}")
    passed("尖峰检测器: 正常噪声不误报,注入的尖峰、NaN、inf 全部抓到(三种量级的曲线)")
