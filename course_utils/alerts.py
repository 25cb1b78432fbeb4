"""Alerts: a loss or grad-norm spike detector, and the rate of bad steps in a recent window.

What: ``SpikeDetector`` flags a value far above the median of the recent values (online: it
judges each value from the past only); ``RecentSteps`` counts the marked (bad) steps among
the last ``window`` steps. ``course_utils.monitor.Monitor`` runs one detector on the loss and
one on the pre-clip grad norm, and keeps its bad steps in a ``RecentSteps``.

Why: a run on a remote machine must raise its own alarm. A fixed threshold fits one task's
loss scale (0.02 or 20) and no other; the mean and standard deviation of the recent values are
inflated by the very spikes they should find. The median and the median absolute deviation
(MAD) are not, and ``min_ratio`` keeps a plateau (MAD ≈ 0) from alarming on noise.

Pitfall: NaN/inf. ``nan > limit`` is False, so a NaN compared like a number is never flagged,
and a non-finite value let into the window poisons every later judgement: both are flagged
and kept out. And "stop after 5 bad steps in a row" never fires when every other step is
bad; a rate over a window ("5 of the last 50") does.

Example::

    loss_alarm, bad = SpikeDetector(explode_ratio=10.0), RecentSteps(window=50)
    if loss_alarm.update(loss):
        bad.add(step)
    if bad.count(step) >= 5: ...      # stop: too many bad steps

Taught in ``06_monitoring`` §1 (``SpikeDetector`` checks the live-plot run's logged grad norms for spikes;
§4's Monitor runs two of them, and the exercise of §5 writes the same rule as ``find_spikes``). ``RecentSteps`` is reference machinery of ``solutions/homework/train_cifar_pro.py``
(``--max-bad-steps`` within ``--bad-step-window``; a checkpoint is known-good when the window is clean).
"""
from __future__ import annotations

import math
import statistics
from collections import deque

__all__ = ["SpikeDetector", "RecentSteps"]


class SpikeDetector:
    """Flags a value far above the recent median: robust to ordinary noise, loud on spikes.

    A value is a spike when it is not finite, or when, after ``warmup`` values, it exceeds
    both ``median + threshold * 1.4826 * MAD`` and ``min_ratio * median`` of the last
    ``window`` values. Before ``warmup`` values there is no noise estimate and no judgement,
    except, with ``explode_ratio``, for a value more than ``explode_ratio`` times every value
    so far (an lr blow-up at step 2 must not wait 20 steps to be noticed).
    """

    def __init__(self, window: int = 50, threshold: float = 6.0, min_ratio: float = 1.5, warmup: int = 20,
                 explode_ratio: float | None = None) -> None:
        self.window, self.threshold, self.min_ratio, self.warmup = window, threshold, min_ratio, warmup
        self.explode_ratio = explode_ratio
        self.history: deque[float] = deque(maxlen=window)

    def update(self, value: float) -> bool:
        """Judge ``value`` against the window, then (if finite) add it: True for a spike."""
        if not math.isfinite(value):
            return True
        spike = False
        if len(self.history) >= self.warmup:
            med = statistics.median(self.history)
            mad = statistics.median(abs(v - med) for v in self.history)
            spike = value > med + self.threshold * 1.4826 * mad and value > self.min_ratio * med
        elif self.explode_ratio is not None and self.history:
            spike = value > self.explode_ratio * max(self.history)
        self.history.append(value)
        return spike

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state["history"], maxlen=self.window)


class RecentSteps:
    """The marked steps among the last ``window`` steps: a rate, not only a streak. A step marked twice counts once."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window 至少为 1,实际是 {window}")
        self.window = window
        self.steps: set[int] = set()

    def add(self, step: int) -> None:
        self.steps.add(int(step))

    def count(self, step: int) -> int:
        """How many marked steps lie in ``(step - window, step]``. Marks older than that window are
        forgotten, so ask with non-decreasing steps (a training loop does)."""
        self.steps = {s for s in self.steps if s > step - self.window}
        return sum(1 for s in self.steps if s <= step)

    def state_dict(self) -> dict:
        return {"window": self.window, "steps": sorted(self.steps)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = {int(s) for s in state["steps"]}
