"""Typical wrong answers of notebook 06_monitoring: find_spikes.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_LOOP = '''
import math, statistics

def find_spikes(values, window=20, threshold=6.0, min_ratio=1.5):
    history, spikes = [], []
    for i, value in enumerate(values):
        value = float(value)
{body}
    return spikes
'''

WRONG = {
    # a fixed number: right for one task's loss scale, wrong for every other
    "fixed threshold": '''
import math

def find_spikes(values, window=20, threshold=6.0, min_ratio=1.5):
    return [i for i, v in enumerate(values) if not math.isfinite(v) or v > 3.0]
''',
    # mean + 3 std of the whole curve: uses the future, and the spikes inflate the std
    "global mean and std": '''
import numpy as np

def find_spikes(values, window=20, threshold=6.0, min_ratio=1.5):
    a = np.asarray(values, dtype=float)
    finite = a[np.isfinite(a)]
    limit = finite.mean() + 3 * finite.std()
    return [i for i, v in enumerate(a) if not np.isfinite(v) or v > limit]
''',
    # never alarms
    "no alarms": '''
def find_spikes(values, window=20, threshold=6.0, min_ratio=1.5):
    return []
''',
    # issue 13 item 4: NaN/inf are flagged but also appended to the window
    "non-finite values let into the window": _LOOP.format(body='''
        recent = history[-window:]
        if not math.isfinite(value):
            spikes.append(i)
        elif len(recent) >= window:
            med = statistics.median(recent)
            mad = statistics.median(abs(v - med) for v in recent)
            if value > med + threshold * 1.4826 * mad and value > min_ratio * med:
                spikes.append(i)
        history.append(value)
'''),
    # NaN is not special-cased: `nan > limit` is False, so NaN is never flagged (and enters the window)
    "NaN compared like a number": _LOOP.format(body='''
        recent = [v for v in history[-window:] if math.isfinite(v)]
        if len(history) >= window and recent:
            med = statistics.median(recent)
            mad = statistics.median(abs(v - med) for v in recent)
            if value > med + threshold * 1.4826 * mad and value > min_ratio * med:
                spikes.append(i)
        history.append(value)
'''),
    # the median of ALL past values instead of the last `window`
    "whole history instead of the window": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i)
            continue
        if len(history) >= window:
            med = statistics.median(history)
            mad = statistics.median(abs(v - med) for v in history)
            if value > med + threshold * 1.4826 * mad and value > min_ratio * med:
                spikes.append(i)
        history.append(value)
'''),
    # forgets the min_ratio condition: on a plateau the MAD is ~0 and anything alarms
    "no min_ratio": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i)
            continue
        recent = history[-window:]
        if len(recent) >= window:
            med = statistics.median(recent)
            mad = statistics.median(abs(v - med) for v in recent)
            if value > med + threshold * 1.4826 * mad:
                spikes.append(i)
        history.append(value)
'''),
    # only the ratio to the median: ordinary noise of a noisy curve alarms
    "ratio to the median only": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i)
            continue
        recent = history[-window:]
        if len(recent) >= window and value > min_ratio * statistics.median(recent):
            spikes.append(i)
        history.append(value)
'''),
    # local mean + 3 std: not robust, a spike in the window hides the next one
    "local mean and std": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i)
            continue
        recent = history[-window:]
        if len(recent) >= window:
            mean = sum(recent) / len(recent)
            std = math.sqrt(sum((v - mean) ** 2 for v in recent) / len(recent))
            if value > mean + 3 * std and value > min_ratio * mean:
                spikes.append(i)
        history.append(value)
'''),
    # judges from the second value on, before the window is full
    "no warm-up (judges with fewer than window values)": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i)
            continue
        recent = history[-window:]
        if recent:
            med = statistics.median(recent)
            mad = statistics.median(abs(v - med) for v in recent)
            if value > med + threshold * 1.4826 * mad and value > min_ratio * med:
                spikes.append(i)
        history.append(value)
'''),
    # 1-based step numbers instead of list indices
    "1-based indices": _LOOP.format(body='''
        if not math.isfinite(value):
            spikes.append(i + 1)
            continue
        recent = history[-window:]
        if len(recent) >= window:
            med = statistics.median(recent)
            mad = statistics.median(abs(v - med) for v in recent)
            if value > med + threshold * 1.4826 * mad and value > min_ratio * med:
                spikes.append(i + 1)
        history.append(value)
'''),
    # a boolean mask instead of indices
    "boolean mask": '''
import math

def find_spikes(values, window=20, threshold=6.0, min_ratio=1.5):
    return [not math.isfinite(v) for v in values]
''',
}
