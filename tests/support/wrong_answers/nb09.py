"""Typical wrong answers of notebook 09_self_test: self_test_answers (a distractor per question) and ema_start_weight (functions).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

# (question, wrong answer): each a distractor a learner plausibly picks
WRONG_ANSWERS = [
    ("q1", "A"),       # "everything is bf16, memory halves": master weights are fp32
    ("q1", "C"),       # bf16 master weights
    ("q2", "A"),       # "fp32 is faster"
    ("q3", "A"),       # "bf16 has more mantissa bits": it has fewer
    ("q3", "C"),       # "autocast scales the loss in bf16"
    ("q4", "AC"),      # forgot update()
    ("q4", "ABCD"),    # "it also scales activations"
    ("q5", "AB"),      # forgot the RNG and data order
    ("q5", "ABCD"),    # "the weights are lost"
    ("q6", "A"),       # learnt "tune the learning rate first"
    ("q6", "C"),       # learnt the overfit order without NaN first (07's and the seed's old order)
    ("q6", "D"),       # learnt the gradient chain straight after the loss (10's old order)
    ("q7", "ABE"),     # too many
    ("q7", "A"),       # only the cut chain
    ("q8", "A"),       # "buy a bigger GPU"
    ("q9", "A"),       # element-wise clipping to [-1, 1]
    ("q9", "D"),       # "5.0 means clipping failed"
    ("q10", 0.8),      # 1 - 200 * 0.001: the linear approximation
    ("q10", 0.18),     # the share of the new weights instead
    ("q10", 82),       # a percentage instead of a fraction
    ("q11", 4.2),      # samples/s taken as steps/s
    ("q11", 60_000),   # seconds instead of hours
    ("q13", "A"),      # divides by K: right only when the micro-batches are the same size
    ("q13", "D"),      # "backward twice averages by itself": it sums the two means
    ("q14", 180),      # the interval taken as M itself
    ("q14", 2.45),     # M put in as 180 (minutes) next to C in seconds: √(2·60·180) = 147, read as minutes
    ("q14", 1138),     # seconds, not minutes
    ("q14", 13.4),     # √(C·M): the 2 forgotten
    ("q14", 38.0),     # the restart counted into the save: √(2·(60 + 180)·10800) / 60
]


WRONG_EMA = {
    # 1 - steps * (1 - decay): the linear approximation
    "linear approximation": (lambda d, n: max(0.0, 1 - n * (1 - d)), "线性近似"),
    # the share of the new weights
    "complement": (lambda d, n: 1 - d ** n, "新权重"),
    # one update too many or too few
    "exponent off by one": (lambda d, n: d ** (n + 1), "差了一次"),
    "exponent one short": (lambda d, n: d ** max(n - 1, 0), None),
    # (1 - decay) ** steps: the weight of one new step, raised
    "wrong base": (lambda d, n: (1 - d) ** n, None),
    # a string
    "string": (lambda d, n: f"{d ** n:.3f}", "返回一个数"),
}
