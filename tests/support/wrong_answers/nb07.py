"""Typical wrong answers of notebook 07_single_batch_overfit: overfit_one_batch and diagnose (bodies of the functions; see _LOOP and _DIAGNOSE).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_LOOP = '''
import copy
import torch
import torch.nn.functional as F

def overfit_one_batch(model, x, y, steps=200, lr=3e-3):
{body}
'''

# name -> (body of overfit_one_batch, a fragment the failure message must contain)
WRONG_OVERFIT = {
    # forgets optimizer.step(): the loss never moves
    "no step": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
    return losses''', "第 2 步"),
    # a pretty curve and no training at all
    "fake curve": ('''
    return [2.3 * 0.9 ** i for i in range(steps)]''', "第 1 个 loss"),
    # forgets zero_grad: gradients accumulate over the steps (it still ends near 0 on this batch)
    "no zero_grad": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "zero_grad"),
    # records the loss after the update (evaluates again): the first entry is not the initial loss
    "loss recorded after the step": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append(F.cross_entropy(model(x), y).item())
    return losses''', "更新之前"),
    # plain SGD instead of Adam: far too slow at this learning rate
    "SGD instead of Adam": ('''
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "Adam"),
    # a learning rate copied from the notebook instead of the argument
    "ignores lr": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "lr"),
    # a new optimizer inside the loop: Adam's moments restart at every step
    "optimizer rebuilt every step": ('''
    losses = []
    for _ in range(steps):
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "只在循环外建一次"),
    # trains a copy "to keep the original safe": the caller's model never learns
    "trains a copy": ('''
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "就地"),
    # keeps the loss tensors (and the graph) instead of loss.item()
    "tensors instead of floats": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return losses''', "loss.item()"),
    # off by one: range(1, steps)
    "one step short": ('''
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(1, steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses''', "长度为"),
}


_DIAGNOSE = '''
import math
import numpy as np

def diagnose(losses, grad_norms):
    losses, grad_norms = np.asarray(losses, dtype=float), np.asarray(grad_norms, dtype=float)
{body}
'''

# name -> body of diagnose
WRONG_DIAGNOSE = {
    # the example: thresholds on the final loss, read off the notebook's table (10 classes)
    "final-loss thresholds": '''
    final = losses[-1]
    if grad_norms.max() == 0:
        return "detached"
    if final < 0.1:
        return "healthy"
    if final < 2.0:
        return "wrong_loss"
    if final < 2.25:
        return "shuffled_labels"
    return "lr_too_small"''',
    # looks at the loss only: everything that does not reach 0 is "labels"
    "loss only": '''
    return "healthy" if losses[-1] < 0.1 else "shuffled_labels"''',
    # "still near ln(10)" as the test for a flat curve: only right for 10 classes
    "anchored to ln(10)": '''
    if losses[-1] < 0.1:
        return "healthy"
    if abs(losses[-1] - math.log(10)) < 0.2:
        return "detached" if grad_norms.max() == 0 else "lr_too_small"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "wrong_loss"''',
    # wrong_loss recognised by its floor at 10 classes, ln(e + 9) - 1 = 1.461
    "wrong_loss by its 10-class floor": '''
    if grad_norms.max() == 0:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    if abs(losses[-1] - 1.461) < 0.3:
        return "wrong_loss"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "lr_too_small"''',
    # a small final grad norm taken as "the chain is cut": a memorised batch has one too
    "small grad norm means detached": '''
    if grad_norms[-1] < 0.05:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # never looks at the grad norm: a flat line is always "learning rate"
    "ignores the grad norm": '''
    if losses[-1] < 0.1:
        return "healthy"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # measures the jitter over the whole curve: every fast initial descent looks "noisy"
    "jitter over the whole curve": '''
    if grad_norms.max() == 0:
        return "detached"
    if np.abs(np.diff(losses)).mean() > 0.005:
        return "shuffled_labels"
    if losses[-1] < 0.1:
        return "healthy"
    if (losses[0] - losses[-1]) / losses[0] < 0.1:
        return "lr_too_small"
    return "wrong_loss"''',
    # "loss barely fell" tested before "grad norm is zero": a detached run reads as a small lr
    "drop tested before the grad norm": '''
    if losses[-1] < 0.1:
        return "healthy"
    if (losses[0] - losses[-1]) / losses[0] < 0.1 and np.abs(np.diff(losses[-30:])).mean() < 0.005:
        return "lr_too_small"
    if grad_norms.max() == 0:
        return "detached"
    if np.abs(np.diff(losses[-30:])).mean() > 0.005:
        return "shuffled_labels"
    return "wrong_loss"''',
    # "the loss fell by less than half" taken as re-shuffled labels: they can fall further
    "shuffled as a small drop": '''
    if grad_norms.max() == 0:
        return "detached"
    if losses[-1] < 0.1:
        return "healthy"
    drop = (losses[0] - losses[-1]) / losses[0]
    if drop < 0.02:
        return "lr_too_small"
    if drop < 0.5 and losses[-1] > 2.0:
        return "shuffled_labels"
    return "wrong_loss"''',
    # a constant answer
    "constant": '''
    return "wrong_loss"''',
}
