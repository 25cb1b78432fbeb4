"""Typical wrong answers of notebook 04_checkpoint_resume: save_checkpoint and load_checkpoint.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_SAVE_ALL = '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "rng": rng_state()}, path)
'''
_HEADER = '''
import random
import numpy as np
import torch
from course_utils.repro import rng_state, set_rng_state
'''

# name -> (source, a fragment the failure message must contain)
WRONG = {
    # the chapter's "新手做法": weights only
    "weights only": ('''
import torch
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save(model.state_dict(), path)
def load_checkpoint(path, model, optimizer, scheduler):
    model.load_state_dict(torch.load(path, weights_only=True))
    return 0, 0
''', "epoch"),
    # forgets the optimizer: AdamW moments start from zero
    "forgets the optimizer": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch,
                "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "优化器"),
    # saves the optimizer but forgets to load it back
    "saves but never loads the optimizer": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "优化器"),
    # forgets the scheduler: warm-up starts again
    "forgets the scheduler": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "last_epoch"),
    # "continues" the schedule with one extra scheduler.step() after loading: off by one
    "steps the scheduler after loading": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); scheduler.step()
    set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "不要再调 scheduler.step"),
    # forgets every RNG state
    "forgets the RNG state": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    return s["epoch"], s["step"]
''', "python random"),
    # the chapter's five elements taken literally: torch (and CUDA) RNG only, python and numpy forgotten
    "torch RNG only": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"]["torch"])
    return s["epoch"], s["step"]
''', "python random"),
    # torch and python, numpy forgotten (a numpy augmentation then differs)
    "no numpy RNG": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    v, internal, g = s["py_rng"]; random.setstate((v, tuple(internal), g)); torch.set_rng_state(s["torch_rng"])
    return s["epoch"], s["step"]
''', "numpy"),
    # numpy's key array saved, its position (and cached gaussian) dropped
    "numpy state without its position": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    keys = np.random.get_state()[1]
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(),
                "np_keys": torch.from_numpy(keys.astype(np.int64))}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    v, internal, g = s["py_rng"]; random.setstate((v, tuple(internal), g))
    np.random.set_state(("MT19937", s["np_keys"].numpy().astype(np.uint32), 0))
    torch.set_rng_state(s["torch_rng"])
    return s["epoch"], s["step"]
''', "numpy"),
    # restores the RNG first, then draws from it (a dropout forward pass to "warm up")
    "restores the RNG first, then draws from it": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    set_rng_state(s["rng"])
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"])
    torch.rand(1); random.random(); np.random.rand()
    return s["epoch"], s["step"]
''', "python random"),
    # np.random.get_state() stored as is: written, but not loadable with weights_only=True
    "numpy RNG stored as is": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                "rng": torch.get_rng_state(), "np": np.random.get_state(), "py": random.getstate()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=False)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); torch.set_rng_state(s["rng"])
    np.random.set_state(s["np"]); random.setstate(s["py"])
    return s["epoch"], s["step"]
''', "weights_only"),
    # pickles the optimizer object itself
    "saves the optimizer object": (_HEADER + '''
def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer, "scheduler": scheduler.state_dict(),
                "epoch": epoch, "step": step, "rng": rng_state()}, path)
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=False)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"].state_dict())
    scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["epoch"], s["step"]
''', "weights_only"),
    # returns (step, epoch)
    "returns step and epoch swapped": (_HEADER + _SAVE_ALL + '''
def load_checkpoint(path, model, optimizer, scheduler):
    s = torch.load(path, weights_only=True)
    model.load_state_dict(s["model"]); optimizer.load_state_dict(s["optimizer"])
    scheduler.load_state_dict(s["scheduler"]); set_rng_state(s["rng"])
    return s["step"], s["epoch"]
''', "顺序反了"),
}
