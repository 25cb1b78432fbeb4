"""Typical wrong answers of notebook 03_ema: ema_update_.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_BUFFERS = '''
        for e, b in zip(ema_model.buffers(), model.buffers()):
            e.copy_(b)
'''

# name -> (source of ema_update_, a fragment the failure message must contain)
WRONG = {
    # decay and 1 - decay swapped: the live weights get the large share
    "swapped decay": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.mul_(1 - decay).add_(p, alpha=decay)
''' + _BUFFERS, "对调"),
    # lerp's weight is the share of the END point: lerp_(p, decay) is the same swap
    "lerp weight = decay": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, decay)
''' + _BUFFERS, "对调"),
    # averages from the first call on: the shadow starts from the initial weights
    "no first copy": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.mul_(decay).add_(p, alpha=1 - decay)
''' + _BUFFERS, "直接复制"),
    # copies on the first call only when num_updates == 1 (off by one)
    "first copy at num_updates == 1": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 1 else e.mul_(decay).add_(p, alpha=1 - decay)
''' + _BUFFERS, "直接复制"),
    # forgets the buffers (BatchNorm statistics stay at their initial values)
    "parameters only": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - decay)
''', "buffers"),
    # averages the float buffers too (num_batches_tracked copied)
    "buffers averaged": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - decay)
        for e, b in zip(ema_model.buffers(), model.buffers()):
            e.copy_(b) if num_updates == 0 or not e.is_floating_point() else e.lerp_(b, 1 - decay)
''', "不做平均"),
    # copies everything every step: no averaging at all
    "copy always": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    ema_model.load_state_dict(model.state_dict())
''', "decay"),
    # rebinds the loop variable: nothing changes after the first copy
    "not in place": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            if num_updates == 0:
                e.copy_(p)
            else:
                e = decay * e + (1 - decay) * p
''' + _BUFFERS, "原地"),
    # in place on a parameter that requires grad, outside torch.no_grad()
    "no torch.no_grad()": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.copy_(p) if num_updates == 0 else e.mul_(decay).add_(p.detach(), alpha=1 - decay)
    for e, b in zip(ema_model.buffers(), model.buffers()):
        e.copy_(b)
''', "no_grad"),
    # adds an EMA warm-up that the exercise does not ask for
    "EMA warm-up": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    d = min(decay, (1 + num_updates) / (10 + num_updates))
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            e.copy_(p) if num_updates == 0 else e.lerp_(p, 1 - d)
''' + _BUFFERS, "渐升"),
    # updates the live model towards the EMA instead
    "updates the wrong model": ('''
import torch
def ema_update_(ema_model, model, decay, num_updates):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            if num_updates == 0:
                e.copy_(p)
            else:
                p.lerp_(e, decay)
                e.copy_(p)
''' + _BUFFERS, "model 只读"),
}
