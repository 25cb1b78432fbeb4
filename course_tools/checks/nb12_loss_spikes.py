"""Checks for 12_loss_spikes.ipynb: name the cause of a spike from a run's records.

``check_diagnose(diagnose_spike, seed=1234)`` builds runs' records around a spike from ``seed`` (each record:
``step``, ``loss``, the pre-clip ``grad_norm``, ``lr``, the batch's ``batch_mean`` and ``batch_std``); each case's
cause is known by construction and agrees with :func:`reference_cause`, the rule the notebook teaches. The cases
target the typical mistakes: a bad batch whose loss stays high (a smoothed loss sees only a lasting rise), bad
batches during the lr warm-up, a batch so bad its loss is inf, lr blow-ups ending in NaN, an lr jump followed at
once by a NaN, an inf grad norm under a finite loss, NaN steps without precursor (NaN compares False to all). Example::

    check_diagnose(diagnose_spike)
"""
from __future__ import annotations

import copy
import math
import statistics
from typing import Callable

import numpy as np

from course_tools.checks import call_learner, exercise_check, expect, fail, passed

__all__ = ["CAUSES", "WINDOW", "RATIO", "LEAD", "first_alarm", "reference_cause", "check_cases", "check_diagnose",
           "HINTS"]

CAUSES = ("data", "lr", "numerics")
WINDOW, RATIO, LEAD = 20, 3.0, 5


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def first_alarm(records: list[dict], window: int = WINDOW, ratio: float = RATIO) -> int | None:
    """Index of the first record that is non-finite or ``ratio`` x above the recent median (loss or grad norm)."""
    for i, r in enumerate(records):
        if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
            return i
        if i < window // 2:
            continue
        for key in ("loss", "grad_norm"):
            past = _finite([q[key] for q in records[max(0, i - window):i]])
            if past and r[key] > ratio * statistics.median(past):
                return i
    return None


def reference_cause(records: list[dict], window: int = WINDOW) -> str:
    """The notebook's rule, in the order of the tests below: the first alarm's batch is abnormal -> "data"; the lr
    jumped or the grad norm was already rising -> "lr"; the alarm is a NaN/inf -> "numerics"; otherwise "data"."""
    t = first_alarm(records, window)
    if t is None:
        raise ValueError("no alarm in these records")
    before = records[max(0, t - window):t]
    std = statistics.median(r["batch_std"] for r in before)
    mean = statistics.median(r["batch_mean"] for r in before)
    here = records[t]
    if not (std / RATIO < here["batch_std"] < RATIO * std) or abs(here["batch_mean"] - mean) > 3 * std:
        return "data"
    lr_jump = here["lr"] > 2 * statistics.median(r["lr"] for r in before)
    lead = _finite([r["grad_norm"] for r in records[max(0, t - LEAD):t]])
    base = _finite([r["grad_norm"] for r in records[max(0, t - window):max(0, t - LEAD)]])
    rising = bool(lead and base) and statistics.median(lead) > 1.3 * statistics.median(base)
    if lr_jump or rising:
        return "lr"
    if not (math.isfinite(here["loss"]) and math.isfinite(here["grad_norm"])):
        return "numerics"
    return "data"


# --- the cases ------------------------------------------------------------------------------------

def _background(rng: np.random.Generator, n: int, lr_shape: str) -> list[dict]:
    """A healthy stretch of a run: decaying noisy loss, steady grad norm, an lr schedule, normal batches."""
    start = int(rng.integers(50, 2000))
    scale, gnorm = float(rng.uniform(0.5, 3.0)), float(rng.uniform(0.3, 5.0))
    base_lr = float(10 ** rng.uniform(-4, -2))
    t = np.arange(n)
    loss = scale * (0.6 + 0.4 * np.exp(-t / rng.uniform(30, 80))) * np.exp(rng.normal(0, 0.05, n))
    grad = gnorm * np.exp(rng.normal(0, 0.1, n))
    if lr_shape == "warmup":
        lr = base_lr * (t + int(rng.integers(5, 15))) / (n + 15)
    elif lr_shape == "cosine":
        lr = base_lr * (0.55 + 0.45 * np.cos(np.pi * (t + 20) / (2.5 * n)))
    else:
        lr = np.full(n, base_lr)
    mean0, std0 = float(rng.uniform(-0.1, 0.1)), float(rng.uniform(0.8, 1.1))
    return [{"step": start + int(i), "loss": float(loss[i]), "grad_norm": float(grad[i]), "lr": float(lr[i]),
             "batch_mean": mean0 + float(rng.normal(0, 0.03)), "batch_std": std0 * float(np.exp(rng.normal(0, 0.03)))}
            for i in range(n)]


def _data_case(rng, variant: str) -> tuple[str, list[dict]]:
    n = 60
    records = _background(rng, n, "warmup" if variant == "warm-up" else str(rng.choice(["flat", "cosine"])))
    t = int(rng.integers(32, 45))
    bad = records[t]
    if variant == "constant":   # a batch of one repeated value (a padding or a failed decode)
        bad["batch_std"], bad["batch_mean"] = 0.0, bad["batch_mean"] + float(rng.uniform(1.0, 3.0))
    else:                       # not normalised: pixels 0..255
        bad["batch_mean"], bad["batch_std"] = float(rng.uniform(100, 130)), float(rng.uniform(50, 70))
    if variant == "inf":        # so far out that the loss overflows
        bad["loss"], bad["grad_norm"] = math.inf, math.nan
    else:
        bad["loss"] *= float(rng.uniform(8, 40))
        bad["grad_norm"] *= float(rng.uniform(50, 2000))
    if variant in ("unclipped", "warm-up"):  # no clipping: the update hurt, the loss stays up for a while
        for k in range(t + 1, n):
            lift = 1 + float(rng.uniform(1.5, 3.0)) * math.exp(-(k - t) / 12)
            records[k]["loss"] *= lift
            records[k]["grad_norm"] *= lift
    names = {"clipped": "一个未归一化的 batch(裁剪后立即恢复)", "unclipped": "一个未归一化的 batch(没有裁剪,之后 loss 居高一阵)",
             "warm-up": "学习率预热期间的一个未归一化 batch", "inf": "一个离谱到 loss 变成 inf 的 batch",
             "constant": "一个所有像素都相同的 batch"}
    return f"{names[variant]},在第 {bad['step']} 步", records


def _lr_case(rng, variant: str) -> tuple[str, list[dict]]:
    n = 60
    records = _background(rng, n, "warmup" if variant in ("peak", "peak-nan") else "flat")
    onset = int(rng.integers(25, 35))
    if variant == "jump-nan":   # a schedule error: the lr jumps 30-100x, the very next step is NaN
        factor = float(rng.uniform(30, 100))
        for k in range(onset, n):
            records[k]["lr"] *= factor
            records[k]["loss"] = records[k]["grad_norm"] = math.nan
        return f"第 {records[onset]['step']} 步起 lr 跳高 {factor:.0f} 倍,当步就是 NaN", records
    if variant == "jump":
        factor = float(rng.uniform(20, 60))
        for k in range(onset, n):
            records[k]["lr"] *= factor
    steps_to_10x = float(rng.uniform(15, 22))
    for k in range(onset, n):
        g = 10 ** ((k - onset) / steps_to_10x)
        records[k]["grad_norm"] *= g
        records[k]["loss"] *= 1 + 0.6 * max(0.0, g - 2.0)
    if variant == "peak-nan":
        for k in range(onset + int(rng.integers(24, 28)), n):
            records[k]["loss"] = records[k]["grad_norm"] = math.nan
    names = {"peak": "预热的峰值 lr 设得太高", "peak-nan": "预热的峰值 lr 太高,最后变成 NaN",
             "jump": "调度写错,lr 突然跳高"}
    return f"{names[variant]}(从第 {records[onset]['step']} 步起)", records


def _numerics_case(rng, variant: str) -> tuple[str, list[dict]]:
    n = 60
    records = _background(rng, n, str(rng.choice(["flat", "cosine", "warmup"])))
    t = int(rng.integers(30, 45))
    if variant == "dead":        # no guard: NaN in the weights, every later step NaN
        for k in range(t, n):
            records[k]["loss"] = records[k]["grad_norm"] = math.nan
        return f"第 {records[t]['step']} 步起 loss 一直是 NaN(之前一切正常)", records
    if variant == "grad-inf":    # fp16 backward overflowed: the loss is finite, the grad norm is inf
        for k in range(t, n, int(rng.integers(4, 8))):
            records[k]["grad_norm"] = math.inf
        return f"第 {records[t]['step']} 步起每隔几步 grad norm 为 inf,loss 正常", records
    for k in range(t, n, int(rng.integers(3, 7))):  # skipped steps (a guard or GradScaler): inf now and then
        records[k]["loss"], records[k]["grad_norm"] = math.inf, math.nan
    return f"第 {records[t]['step']} 步起每隔几步 loss 为 inf(跳过这些步后继续)", records


_VARIANTS = ([("data", v) for v in ("clipped", "unclipped", "warm-up", "inf", "constant")]
             + [("lr", v) for v in ("peak", "peak-nan", "jump", "jump-nan")]
             + [("numerics", v) for v in ("dead", "grad-inf", "skipped")])
_MAKERS = {"data": _data_case, "lr": _lr_case, "numerics": _numerics_case}


def check_cases(seed: int = 1234) -> list[dict]:
    """The cases: ``name`` (Chinese), ``cause``, ``variant`` and ``records``."""
    rng = np.random.default_rng(seed)
    cases = []
    for cause, variant in _VARIANTS:
        name, records = _MAKERS[cause](rng, variant)
        cases.append({"name": name, "cause": cause, "variant": variant, "records": records})
    return cases


_FAILURE_HINTS = {
    ("data", "lr"): "一个坏 batch 只坏一步: 先看报警那一步的 batch 统计量(均值、标准差)是否离谱,不要一见 grad norm 尖峰就怪学习率",
    ("data", "numerics"): "这一步的 batch 统计量离谱: 坏数据也能让 loss 变成 inf;先看 batch,再谈精度",
    ("lr", "data"): "报警之前几步 grad norm 已经在涨,或记录的 lr 突然变大: 这是学习率;平滑 loss 分不清持续的上升和坏 batch 的余波",
    ("lr", "numerics"): "NaN 之前有预兆(grad norm 先涨,或 lr 跳高)就是学习率;数值问题没有预兆",
    ("numerics", "data"): "NaN 的 <、>、== 比较都是 False,inf 又比任何有限的阈值都大: 先用 math.isfinite 单独判断;batch 正常、没有预兆的 NaN/inf 是数值问题",
    ("numerics", "lr"): "NaN/inf 之前 grad norm 和 lr 都正常: 没有预兆的非有限值是数值问题(fp16 溢出、没 .float() 的 loss)",
}


@exercise_check
def check_diagnose(fn: Callable[[list[dict]], str], seed: int = 1234) -> None:
    """The learner's ``fn(records) -> "data" | "lr" | "numerics"`` must name each case's cause."""
    cases = check_cases(seed)
    for case in cases:
        found = call_learner(fn, copy.deepcopy(case["records"]))
        if found not in CAUSES:
            fail("返回 'data'、'lr'、'numerics' 三个字符串之一", f"{found!r}(情形: {case['name']})",
                 "只返回这三个英文小写字符串之一")
        expect(found == case["cause"], f"{case['name']} → {case['cause']!r}", repr(found),
               _FAILURE_HINTS.get((case["cause"], found), ""))
    passed(f"{len(cases)} 段记录的原因都判断对了(坏数据、学习率、数值各有几种样子)")


HINTS: dict[str, tuple[str, ...]] = {
    "check_diagnose": (
        "分原因看的是第一次报警的那一步和它之前的几步:坏数据只坏一步,而且那一步的 batch 统计量离谱;"
        "学习率的问题有预兆(grad norm 先涨,或者记录的 lr 突然变大);数值问题没有预兆,直接出现 NaN/inf。"
        "只看平滑后的 loss 分不出这三种",
        "12 的「2. 哪个信号最先看见」一节量出了三种原因各自哪个信号先报警;「6. 练习:只看记录,说出原因」"
        "把规则写成了四步,按顺序实现",
        "常错的几处:NaN 的 <、>、== 比较都是 False(inf 则比任何有限数都大),要先单独判断是否有限(loss 和 grad norm 都要看),"
        "算近期中位数时也要去掉非有限值;不要一见 NaN 就判数值、一见 grad norm 尖峰就怪学习率:先看 batch 统计量,"
        "再看预兆;lr 在预热和余弦调度里本来就每步在变,要和它近期的中位数比",
    ),
}
