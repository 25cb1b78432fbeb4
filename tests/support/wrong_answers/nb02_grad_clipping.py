"""Typical wrong answers of notebook 02_grad_clipping: my_clip_grad_norm_ and clipping_is_effective.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

# name -> (source of my_clip_grad_norm_, a fragment the failure message must contain)
WRONG_CLIPS = {
    # clips each parameter on its own: the direction of the whole gradient changes
    "per parameter": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    parameters = list(parameters)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
    for p in parameters:
        if p.grad is not None:
            torch.nn.utils.clip_grad_norm_([p], max_norm)
    return total
''', "逐个参数"),
    # returns the norm measured after clipping
    "returns the post-clip norm": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    parameters = list(parameters)
    torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
''', "裁剪后的范数"),
    # always multiplies by max_norm / norm: small gradients are scaled UP
    "always rescales": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    for g in grads:
        g.mul_(max_norm / total)
    return total
''', "放大"),
    # iterates `parameters` twice: the second loop is empty when it is a generator
    "iterates a generator twice": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total
''', "生成器"),
    # g = g * coef rebinds a local name; the gradients are never modified
    "not in place": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g = g * coef
    return total
''', "原地"),
    # forgets the square root: returns the sum of squares
    "no square root": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = sum((g ** 2).sum() for g in grads)
    coef = max_norm / (total.sqrt() + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total
''', "开平方"),
    # adds the per-parameter norms instead of combining them in quadrature
    "sum of norms": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = sum(g.norm() for g in grads)
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total
''', "直接相加"),
    # element-wise clamping, i.e. clip_grad_value_
    "clamps values": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    for g in grads:
        g.clamp_(-max_norm, max_norm)
    return total
''', "逐元素"),
    # forgets that some parameters have no gradient
    "crashes on a missing grad": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total
''', "AttributeError"),
    # scales the weights instead of the gradients
    "scales the parameters": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    parameters = [p for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        with torch.no_grad():
            for p in parameters:
                p.mul_(coef)
    return total
''', "只修改 .grad"),
    # returns nothing
    "returns None": ('''
import torch
def my_clip_grad_norm_(parameters, max_norm):
    torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
''', "None"),
    "constant": ("def my_clip_grad_norm_(parameters, max_norm):\n    return 1.0\n", "期望"),
}

_AUDIT_HEAD = '''
import torch
import torch.nn.functional as F
from torch import nn

def clipping_is_effective(step_fn):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
'''
_AUDIT_RUN = '''
    before = [p.detach().clone() for p in model.parameters()]
    step_fn(model, optimizer, scaler, x, y, max_norm)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
'''

# name -> (source of clipping_is_effective, a fragment the failure message must contain)
WRONG_AUDITS = {
    "always effective": ("def clipping_is_effective(step_fn):\n    return True\n", "判为有效"),
    "never effective": ("def clipping_is_effective(step_fn):\n    return False\n", "判为无效"),
    # "not larger than max_norm" also accepts clipping the scaled gradients
    "upper bound only": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.SGD(model.parameters(), lr=1.0), torch.amp.GradScaler("cpu", enabled=True), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return moved.item() <= max_norm + 1e-3
''', "不等于"),
    # a disabled scaler hides the "clip before unscale_" bug
    "disabled scaler": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.SGD(model.parameters(), lr=1.0), torch.amp.GradScaler("cpu", enabled=False), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return abs(moved.item() - max_norm) <= 1e-3
''', "enabled=True"),
    # reads .grad after the step instead of the weight change
    "reads .grad after the step": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.SGD(model.parameters(), lr=1.0), torch.amp.GradScaler("cpu", enabled=True), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
    step_fn(model, optimizer, scaler, x, y, max_norm)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return False
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
    return abs(norm.item() - max_norm) <= 1e-3
''', "期望"),
    # Adam: the first update is about lr per element whatever the gradient, so it says nothing about clipping
    "uses Adam": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.Adam(model.parameters(), lr=1.0), torch.amp.GradScaler("cpu", enabled=True), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return abs(moved.item() - max_norm) <= 1e-3
''', "SGD"),
    # the threshold is larger than the gradient norm: clipping never has to act
    "threshold above the gradient norm": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.SGD(model.parameters(), lr=1.0), torch.amp.GradScaler("cpu", enabled=True), 1e4
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return abs(moved.item() - max_norm) <= 1e-3 * max_norm
''', "期望"),
    # forgets to divide the weight change by the learning rate
    "forgets the learning rate": (_AUDIT_HEAD + '''
    optimizer, scaler, max_norm = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu", enabled=True), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return abs(moved.item() - max_norm) <= 1e-3
''', "/ lr"),
    # momentum plus weight decay: the first update is no longer -lr * grad
    "weight decay": (_AUDIT_HEAD + '''
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.5)
    scaler, max_norm = torch.amp.GradScaler("cpu", enabled=True), 1.0
    x, y = torch.randn(16, 8) * 100, torch.randint(0, 4, (16,))
''' + _AUDIT_RUN + '''
    return abs(moved.item() - max_norm) <= 1e-3
''', "权重衰减"),
}
