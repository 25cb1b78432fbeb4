"""Typical wrong answers of notebook 08b_flops_memory: step_flops and peak_memory_bytes (functions, with the right answers they are edits of).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

def _side(s):
    return (s + 2 * 1 - 3) // 2 + 1


def _layers(b, s, side=None):
    """Forward FLOPs of the three layers, by hand (side: the second conv's output size)."""
    side = _side(s) if side is None else side
    return 2 * b * 8 * s * s * 27, 2 * b * 16 * side * side * 72, 2 * b * 16 * side * side * 10


def _right(b, s):
    c1, c2, fc = _layers(b, s)
    return 3 * (c1 + c2 + fc) - c1


FLOP_WRONG_ANSWERS = {
    # a multiply-add counted as one FLOP
    "mac_as_one_flop": (lambda b, s: _right(b, s) / 2, "2 个 FLOP"),
    # backward forgotten: forward only
    "forward_only": (lambda b, s: sum(_layers(b, s)), "只算了前向"),
    # backward counted as 1x forward
    "backward_as_forward": (lambda b, s: 2 * sum(_layers(b, s)), None),
    # the first layer's input gradient counted too (3x forward everywhere)
    "first_layer_input_grad": (lambda b, s: 3 * sum(_layers(b, s)), "第一层"),
    # the stride ignored: the second conv keeps the full size
    "stride_ignored": (lambda b, s: 3 * sum(_layers(b, s, side=s)) - _layers(b, s)[0], "stride"),
    # the padding ignored: H_out = (H - 3) // 2 + 1 in the second conv
    "padding_ignored": (lambda b, s: 3 * sum(_layers(b, s, side=(s - 3) // 2 + 1)) - _layers(b, s)[0], "padding"),
    # the stride's rounding: s / 2 instead of the floor formula (wrong on odd sizes)
    "half_side_unrounded": (lambda b, s: 3 * sum(_layers(b, s, side=s / 2)) - _layers(b, s)[0], "stride"),
    # the batch size forgotten
    "ignores_batch": (lambda b, s: _right(1, s), None),
    # parameters instead of FLOPs: the 6·N rule applied to a CNN
    "six_n_rule": (lambda b, s: 6 * b * (8 * 27 + 16 * 72 + 16 * _side(s) ** 2 * 10), None),
    # the optimizer update counted as one more forward
    "optimizer_as_forward": (lambda b, s: _right(b, s) + sum(_layers(b, s)), None),
    # the number returned as a string
    "returns_string": (lambda b, s: f"{_right(b, s):,}", "返回一个数"),
    # no return statement
    "returns_none": (lambda b, s: None, "返回一个数"),
}


def _params(widths):
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def _acts(widths, b):
    """Bytes of the saved activations: each hidden layer's ReLU output, fp32."""
    return 4 * b * sum(widths[1:-1])


def _budget(widths, b):
    return 16 * _params(widths) + _acts(widths, b)



MEMORY_WRONG_ANSWERS = {
    # the optimizer states forgotten: weights + grads + activations
    "no_optimizer_states": (lambda w, b: 8 * _params(w) + _acts(w, b), "优化器状态"),
    # AdamW counted as one moment (like SGD with momentum)
    "adam_one_moment": (lambda w, b: 12 * _params(w) + _acts(w, b), "两个动量"),
    # the gradients forgotten
    "no_grads": (lambda w, b: 12 * _params(w) + _acts(w, b), "梯度"),
    # the activations forgotten: parameters only
    "no_activations": (lambda w, b: 16 * _params(w), "激活值"),
    # the activations per sample: the batch size forgotten
    "activations_without_batch": (lambda w, b: 16 * _params(w) + _acts(w, 1), "batch"),
    # each hidden layer counted twice (the Linear's output and the ReLU's output)
    "activations_twice": (lambda w, b: 16 * _params(w) + 2 * _acts(w, b), "只算一次"),
    # elements instead of bytes
    "elements_not_bytes": (lambda w, b: _budget(w, b) / 4, "元素个数"),
    # elements for the activations only (the states in bytes)
    "activation_elements": (lambda w, b: 16 * _params(w) + _acts(w, b) / 4, None),
    # MiB instead of bytes
    "returns_mib": (lambda w, b: _budget(w, b) / 2 ** 20, "MiB"),
    # fp16 bytes (2 per element) for everything
    "two_bytes_per_element": (lambda w, b: _budget(w, b) / 2, None),
    # the weights only
    "weights_only": (lambda w, b: 4 * _params(w), None),
    # formatted for printing, or no return statement
    "returns_string": (lambda w, b: f"{_budget(w, b) / 2 ** 20:.1f} MiB", "返回一个数"),
    "returns_none": (lambda w, b: None, "返回一个数"),
}
