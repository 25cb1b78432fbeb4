"""Checks for 06_monitoring.ipynb: a loss-spike detector, judged on a fixed set of curves.

``check_find_spikes(find_spikes, seed=1234)`` builds every curve from ``seed``; the right answer for each is what
``course_utils.alerts.SpikeDetector`` (the same rule, online) reports. Each case (:func:`check_cases`, its hints
name the mistake it catches) targets a typical mistake, so each wrong answer fails whatever the seed: a fixed
threshold or a global statistic, ``value > limit`` on a NaN, non-finite values let into the window, the median
of all past values, a mean + std threshold, a zero MAD without ``min_ratio``, ``min_ratio`` alone on a noisy
curve, a judgement before ``window`` values. Example::

    check_find_spikes(find_spikes)
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

from course_tools.checks import call_learner, exercise_check, expect, fail, passed
from course_utils.alerts import SpikeDetector


__all__ = ["WINDOW", "training_curve", "inject_spikes", "reference_spikes", "check_cases", "check_find_spikes", "HINTS"]

WINDOW, THRESHOLD, MIN_RATIO = 20, 6.0, 1.5


def training_curve(rng: np.random.Generator, n: int, scale: float, tau: float | None = None,
                   floor: float | None = None, noise: float = 0.04) -> tuple[np.ndarray, np.ndarray]:
    """A noisy, decreasing loss curve (fast drop, slow tail, multiplicative noise) and its clean version."""
    t = np.arange(n)
    tau = rng.uniform(15, 60) if tau is None else tau
    floor = rng.uniform(0.1, 0.4) if floor is None else floor
    clean = scale * (floor + (1 - floor) * np.exp(-t / tau))
    return clean * (1 + rng.normal(0, noise, n)), clean


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


def reference_spikes(values: Sequence[float]) -> list[int]:
    """The right answer: the notebook's rule, as ``SpikeDetector`` applies it online."""
    detector = SpikeDetector(window=WINDOW, threshold=THRESHOLD, min_ratio=MIN_RATIO, warmup=WINDOW)
    return [i for i, v in enumerate(values) if detector.update(float(v))]


_NONFINITE_IN_WINDOW = "NaN/inf 不能进入窗口: 否则中位数变成 inf/NaN,之后的尖峰再也报不出来;只把有限值放进历史"
_FALSE_ALARM = "正常的起伏被报成尖峰: 和最近 window 个值的中位数比,阈值 = 中位数 + threshold×1.4826×MAD,并且超过 min_ratio×中位数"


def check_cases(seed: int = 1234) -> list[dict]:
    """The curves the check uses: ``name``, ``values``, and hints for a missed / an extra index."""
    rng = np.random.default_rng(seed)
    # the order of the draws from rng is the cases' order: the same seed gives the same curves
    return [*_scaled_cases(rng), *_non_finite_cases(rng), *_shape_cases(rng)]


def _scaled_cases(rng: np.random.Generator) -> list[dict]:
    """Clean and spiked curves at three loss scales: no fixed threshold fits all of them."""
    cases = []
    scales = [float(rng.uniform(0.01, 0.05)), float(rng.uniform(1.0, 3.0)), float(rng.uniform(8.0, 20.0))]
    for scale in scales:
        values, _ = training_curve(rng, int(rng.integers(200, 400)), scale)
        cases.append({"name": f"初始 loss ≈ {scale:.3g} 的正常曲线(4% 噪声)", "values": values,
                      "missed": "", "extra": _FALSE_ALARM + ";不要用固定阈值或整条曲线的均值"})
    for scale in scales:
        values, clean = training_curve(rng, int(rng.integers(200, 400)), scale)
        spiked, where = inject_spikes(rng, values, clean, int(rng.integers(2, 5)))
        cases.append({"name": f"初始 loss ≈ {scale:.3g} 的曲线,在 {where} 注入 3–8 倍的尖峰", "values": spiked,
                      "missed": "尖峰要和近期(最近 window 个值)的中位数比,而不是整条曲线的统计量",
                      "extra": _FALSE_ALARM})
    return cases


def _non_finite_cases(rng: np.random.Generator) -> list[dict]:
    """NaN and inf alone, and bursts of them followed by a spike."""
    cases = []
    values, _ = training_curve(rng, 200, float(rng.uniform(1.0, 3.0)))
    bad = sorted(int(i) for i in rng.choice(np.arange(40, 200), size=2, replace=False))
    values[bad[0]], values[bad[1]] = math.nan, math.inf
    cases.append({"name": f"第 {bad[0]} 步 NaN、第 {bad[1]} 步 inf", "values": values,
                  "missed": "NaN 的 <、>、== 比较都是 False: 先用 math.isfinite 判断,非有限值一律算尖峰",
                  "extra": _NONFINITE_IN_WINDOW})

    for bad_value, label in ((math.inf, "inf"), (math.nan, "NaN")):
        values, clean = training_curve(rng, 220, float(rng.uniform(1.0, 3.0)))
        start = int(rng.integers(80, 120))
        burst = list(range(start, start + 12))  # e.g. an fp16 overflow stretch: 12 steps in a row
        spike_at = burst[-1] + int(rng.integers(3, 7))
        values[burst] = bad_value
        values[spike_at] = clean[spike_at] * float(rng.uniform(3.0, 8.0))
        cases.append({"name": f"第 {start}–{burst[-1]} 步连续 12 个 {label},第 {spike_at} 步又有一个尖峰",
                      "values": values,
                      "missed": _NONFINITE_IN_WINDOW if label == "inf" else
                      "NaN 要单独判断(比较结果总是 False),而且不能进入窗口",
                      "extra": _NONFINITE_IN_WINDOW})
    return cases


def _shape_cases(rng: np.random.Generator) -> list[dict]:
    """A slow decline, two close spikes, a plateau, heavy noise, a spike before the window fills."""
    cases = []
    values, clean = training_curve(rng, 300, float(rng.uniform(1.0, 3.0)), tau=80.0, floor=0.05)
    late = int(rng.integers(220, 280))
    values[late] = clean[late] * 2.5
    cases.append({"name": f"缓慢下降的曲线,第 {late} 步有一个 2.5 倍的尖峰", "values": values,
                  "missed": "只看最近 window 个值: 和全部历史的中位数比,曲线降下来之后阈值会太高",
                  "extra": _FALSE_ALARM})

    values, clean = training_curve(rng, 200, float(rng.uniform(1.0, 3.0)))
    first = int(rng.integers(80, 140))
    pair = [first, first + int(rng.integers(4, 8))]
    values[pair] = clean[pair] * rng.uniform(5.0, 8.0, size=2)
    cases.append({"name": f"两个挨得很近的尖峰 {pair}", "values": values,
                  "missed": "第一个尖峰还在窗口里时均值和标准差都被它拉大: 用中位数和 MAD(对离群值稳健)",
                  "extra": _FALSE_ALARM})

    level = float(rng.uniform(1.0, 3.0))
    values = level * (1 + rng.normal(0, 1e-4, 150))  # a stuck loss: almost constant
    bump = int(rng.integers(60, 140))
    values[bump] = level * 1.1
    cases.append({"name": f"几乎不变的平台(相对噪声 1e-4),第 {bump} 步高出 10%", "values": values,
                  "missed": "", "extra": "平台上 MAD≈0,阈值几乎等于中位数: 还要求超过 min_ratio × 中位数,否则一点起伏就报警"})

    n = 300
    values = float(rng.uniform(1.0, 3.0)) * np.exp(rng.normal(0, 0.3, n)) * np.linspace(1.0, 0.6, n)
    cases.append({"name": "噪声很大的曲线(对数正态,σ=0.3)", "values": values,
                  "missed": "噪声尺度用 1.4826 × MAD 估计,阈值 = 中位数 + threshold × 1.4826 × MAD",
                  "extra": "噪声大时光看 min_ratio × 中位数 会误报: 两个条件要同时满足(MAD 那条估计噪声尺度)"})

    values, clean = training_curve(rng, 120, float(rng.uniform(1.0, 3.0)))
    early, early_nan = int(rng.integers(5, WINDOW - 2)), int(rng.integers(2, 5))
    values[early] = clean[early] * float(rng.uniform(5.0, 8.0))
    values[early_nan] = math.nan
    cases.append({"name": f"第 {early_nan} 步 NaN,第 {early} 步(之前不足 {WINDOW} 个值)有一个尖峰", "values": values,
                  "missed": "NaN/inf 从第一步起就算尖峰",
                  "extra": f"过去不足 window({WINDOW})个有限值时还没法估计噪声,不报警(NaN/inf 除外)"})
    return cases

def _as_indices(found, n: int, case: str) -> list[int]:
    try:
        items = list(found)
        if any(isinstance(i, (bool, np.bool_)) for i in items):
            raise TypeError("a mask")
        idx = sorted({int(i) for i in items})
    except (TypeError, ValueError):
        fail("返回尖峰下标的列表,例如 [57, 120]", f"{type(found).__name__}: {str(found)[:60]}",
             "返回下标(int),不是值,也不是 True/False 的列表")
    expect(all(0 <= i < n for i in idx), f"{case}: 下标在 0..{n - 1} 之间", f"{idx[:8]}",
           "返回的是 0 开始的下标吗?")
    return idx


@functools.lru_cache(maxsize=64)
def _expected_spikes(seed: int) -> tuple[tuple[int, ...], ...]:
    """``reference_spikes`` of each of ``check_cases(seed)``: computed once per seed."""
    return tuple(tuple(reference_spikes(case["values"])) for case in check_cases(seed))


@exercise_check
def check_find_spikes(find_spikes: Callable[[Sequence[float]], Sequence[int]], seed: int = 1234) -> None:
    """``find_spikes(values)`` must return exactly the spikes the rule defines, on every case."""
    for case, expected in zip(check_cases(seed), _expected_spikes(seed)):
        values = case["values"]
        found = _as_indices(call_learner(find_spikes, values.tolist()), len(values), case["name"])
        expected = list(expected)
        missed = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        want = f"{case['name']}: 报警 {expected if expected else '无'}"
        if expected and found == [i + 1 for i in expected]:
            fail(want, f"{found[:6]}", "下标从 0 开始: 返回 enumerate 给出的 i,不是 i + 1")
        expect(not missed, want, f"漏掉了 {missed[:6]}" + (f",还误报了 {extra[:4]}" if extra else ""), case["missed"])
        early = [i for i in extra if np.isfinite(values[:i]).sum() < WINDOW]
        expect(not early or early != extra, want, f"误报了 {extra[:6]}",
               f"前面还不足 window({WINDOW})个有限值,没法估计噪声,不应报警(NaN/inf 除外);"
               "阈值只来自这一步之前最近 window 个值")
        expect(not extra, want, f"误报了 {extra[:6]}", case["extra"])
    passed("尖峰检测器: 三种量级的正常曲线不误报;尖峰、NaN/inf(单个和连续一段)、挨得近的尖峰全部抓到;"
           "平台、大噪声和开头不足一个窗口时不乱报")


HINTS: dict[str, tuple[str, ...]] = {
    "check_find_spikes": (
        "尖峰是相对最近一段历史而言的:拿当前值和它之前一个窗口的典型水平比,用对离群值不敏感的统计量(中位数一类),"
        "而不是拿整条曲线或一个固定数值当基准;非有限值本身就是最严重的报警",
        "06 的「4. 远程训练的标准做法:尖峰自动报警 + 按时间自动保存检查点」一节用 SpikeDetector 演示了同一条规则,"
        "练习的说明写了 window、threshold、min_ratio 各管什么",
        "常错的几处:NaN/inf 混进了历史窗口,之后的中位数全被污染;历史不足 window 个值时就开始判断;"
        "只用倍数或只用偏离量中的一个条件;返回的是布尔列表或从 1 开始的下标,而不是从 0 开始的下标列表",
    ),
}
