"""Typical wrong answers of notebook 12_loss_spikes: diagnose_spike.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_ALARM = '''
import math, statistics

def _alarm(records, window=20, ratio=3.0):
    for i, r in enumerate(records):
        if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
            return i
        if i < window // 2:
            continue
        for key in ("loss", "grad_norm"):
            past = [q[key] for q in records[max(0, i - window):i] if math.isfinite(q[key])]
            if past and r[key] > ratio * statistics.median(past):
                return i
    return len(records) - 1

def _bad_batch(records, t, window=20):
    before = records[max(0, t - window):t]
    std = statistics.median(r["batch_std"] for r in before)
    mean = statistics.median(r["batch_mean"] for r in before)
    return not (std / 3 < records[t]["batch_std"] < 3 * std) or abs(records[t]["batch_mean"] - mean) > 3 * std
'''

WRONG = {
    # looks at the smoothed loss only: a rise that lasts is "lr", a NaN is "numerics", else "data"
    "smoothed loss only": '''
import math, statistics

def diagnose_spike(records, window=20):
    smooth, s = [], None
    for r in records:
        s = r["loss"] if s is None else 0.9 * s + 0.1 * r["loss"]
        smooth.append(s)
    if any(not math.isfinite(v) for v in smooth):
        return "numerics"
    base = statistics.median(smooth[:window])
    high = [v > 1.5 * base for v in smooth]
    return "lr" if sum(high) >= 5 else "data"
''',
    # blames the lr for every grad-norm spike, a single bad batch included
    "grad-norm spike means lr": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    r = records[t]
    if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
        return "numerics"
    return "lr"
''',
    # ignores non-finite steps: NaN/inf compared like numbers (never above the median), the median poisoned
    "ignores non-finite steps": '''
import statistics

def diagnose_spike(records, window=20):
    for i in range(window, len(records)):
        past = records[i - window:i]
        if records[i]["loss"] > 3 * statistics.median(q["loss"] for q in past):
            std = statistics.median(q["batch_std"] for q in past)
            if not (std / 3 < records[i]["batch_std"] < 3 * std):
                return "data"
            return "lr"
    return "data"
''',
    # every NaN/inf is numerics, even one that an lr blow-up or a bad batch led to
    "non-finite always means numerics": _ALARM + '''
def diagnose_spike(records, window=20):
    import math
    if any(not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])) for r in records):
        return "numerics"
    t = _alarm(records, window)
    return "data" if _bad_batch(records, t, window) else "lr"
''',
    # the batch statistics only: abnormal batch -> data, anything else -> lr
    "batch statistics only": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    return "data" if _bad_batch(records, t, window) else "lr"
''',
    # the lr changed inside the records -> lr (a warm-up or a cosine changes it every step)
    "any lr change means lr": _ALARM + '''
def diagnose_spike(records, window=20):
    if records[-1]["lr"] != records[0]["lr"]:
        return "lr"
    t = _alarm(records, window)
    if _bad_batch(records, t, window):
        return "data"
    return "numerics" if not math.isfinite(records[t]["loss"] + records[t]["grad_norm"]) else "lr"
''',
    # one-step spike -> data, longer trouble -> lr, non-finite -> numerics (no batch statistics, no precursor)
    "spike length decides": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    r = records[t]
    if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
        return "numerics"
    base = statistics.median(q["loss"] for q in records[max(0, t - window):t])
    after = [q for q in records[t + 1:t + 6] if math.isfinite(q["loss"]) and q["loss"] > 1.5 * base]
    return "lr" if len(after) >= 3 else "data"
''',
    # the right rule, but never looks at the grad-norm precursor (only at the logged lr)
    "no grad-norm precursor": _ALARM + '''
def diagnose_spike(records, window=20):
    t = _alarm(records, window)
    if _bad_batch(records, t, window):
        return "data"
    before = records[max(0, t - window):t]
    if records[t]["lr"] > 2 * statistics.median(q["lr"] for q in before):
        return "lr"
    r = records[t]
    return "numerics" if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])) else "data"
''',
    # the right rule, but only the loss is checked for NaN/inf (an inf grad norm under a finite loss is missed)
    "loss-only finiteness": '''
import math, statistics

def diagnose_spike(records, window=20):
    for t, r in enumerate(records):
        if not math.isfinite(r["loss"]):
            break
        if t >= window // 2:
            past = [q["loss"] for q in records[max(0, t - window):t] if math.isfinite(q["loss"])]
            if r["loss"] > 3 * statistics.median(past):
                break
    before = records[max(0, t - window):t]
    std = statistics.median(q["batch_std"] for q in before)
    if not (std / 3 < records[t]["batch_std"] < 3 * std):
        return "data"
    return "numerics" if not math.isfinite(records[t]["loss"]) else "lr"
''',
    # answers in Chinese instead of the three codes
    "Chinese labels": '''
def diagnose_spike(records, window=20):
    return "坏数据"
''',
}
