"""Typical wrong answers of notebook 01_amp: amp_train_step and needs_scaler.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_HEAD = '''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
'''
_SCALED = _HEAD + '''    scaler.scale(loss).backward()
'''

# name -> (source, a fragment the failure message must contain)
WRONG_STEPS = {
    # clips the scaled gradients, then unscales: the threshold is applied to grad * scale
    "clip before unscale_": (_SCALED + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "unscale_ 之前"),
    # never calls unscale_ (scaler.step unscales later, after the clipping)
    "no unscale_": (_SCALED + '''
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "unscale_ 之前"),
    # plain loss.backward(): the gradients are not scaled, but unscale_ still divides by the scale
    "backward without scaler.scale": (_HEAD + '''
    loss.backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "scaler.scale(loss)"),
    # forgets scaler.update(): the scale never grows or backs off
    "forgot update": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return norm
''', "scaler.update()"),
    # update before step: step then unscales a second time
    "update before step": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return norm
''', "期望"),
    # optimizer.step() directly: the inf step is not skipped and NaN reaches the weights
    "optimizer.step bypasses the scaler": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return norm
''', "scaler.step(optimizer)"),
    # returns the norm after clipping (which equals max_norm) instead of the pre-clip norm
    "returns the post-clip norm": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "裁剪后的范数"),
    # measures the norm but never clips (max_norm=inf)
    "no clipping": (_SCALED + '''
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "忘了裁剪"),
    # clips after the step: the update already used the unclipped gradients
    "clip after step": (_SCALED + '''
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    return norm
''', "step 之后"),
    # no autocast: the forward runs in fp32
    "no autocast": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "autocast"),
    # hard-codes bf16 instead of the amp_dtype argument
    "bf16 hard-coded": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "amp_dtype"),
    # forgets zero_grad: gradients accumulate across steps
    "no zero_grad": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype, enabled=True):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "zero_grad"),
    # model.half() "to save memory": fp16 master weights (unscale_ refuses fp16 gradients)
    "half model": ('''
import torch
import torch.nn.functional as F

def amp_train_step(model, optimizer, scaler, x, y, max_norm, amp_dtype=torch.float16):
    model.half()
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x.half()).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm
''', "FP16"),
    # returns the loss instead of the gradient norm
    "returns the loss": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''', "期望"),
    # forgets the return statement
    "returns None": (_SCALED + '''
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
''', "None"),
}

# name -> (source, fragment)
WRONG_NEEDS_SCALER = {
    # thinks bf16 needs a scaler too ("every 16-bit format does")
    "bf16 too": ("import torch\ndef needs_scaler(dtype):\n    return dtype in (torch.float16, torch.bfloat16)\n",
                 "8 位指数"),
    # decides by the number of bits
    "any 16-bit format": ("import torch\ndef needs_scaler(dtype):\n    return torch.finfo(dtype).bits <= 16\n",
                          "8 位指数"),
    # decides by precision (eps) instead of range: bf16's eps is the largest
    "looks at eps (precision)": ("import torch\ndef needs_scaler(dtype):\n"
                                 "    return torch.finfo(dtype).eps > torch.finfo(torch.float32).eps\n", "尾数"),
    # the comparison the wrong way round: fp64 "needs" it, fp16 does not
    "comparison reversed": ("import torch\ndef needs_scaler(dtype):\n"
                            "    return torch.finfo(dtype).smallest_normal < torch.finfo(torch.float32).smallest_normal\n",
                            "反了"),
    "always": ("def needs_scaler(dtype):\n    return True\n", "期望"),
    "never": ("def needs_scaler(dtype):\n    return False\n", "5 位指数"),
    # returns a string
    "returns a string": ("import torch\ndef needs_scaler(dtype):\n"
                         "    return 'yes' if dtype == torch.float16 else 'no'\n", "True/False"),
}
