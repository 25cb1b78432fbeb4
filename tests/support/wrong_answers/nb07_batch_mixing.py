"""Typical wrong answers of notebook 07_single_batch_overfit exercise 3: batch_mixing (bodies of the function; see _SOURCE).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_SOURCE = '''
import torch

def batch_mixing(model, x, i=0):
{body}
'''

_RIGHT = '''
    was = model.training
    model.eval()
    leaf = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(leaf)[i].sum(), leaf)
    model.train(was)
    return {j for j in range(len(x)) if j != i and bool(grad[j].ne(0).any())}'''


def _mutant(*edits: tuple[str, str]) -> str:
    """The right answer with the learner's mistake: each (old, new) replaced once."""
    body = _RIGHT
    for old, new in edits:
        assert old in body, old
        body = body.replace(old, new, 1)
    return body


_NO_MODE = (("    was = model.training\n    model.eval()\n", ""), ("    model.train(was)\n", ""))

# name -> (body of batch_mixing, a fragment the failure message must contain)
WRONG = {
    # differentiates the whole batch's output: every sample "mixes" in any model
    "whole batch": (_mutant(("model(leaf)[i].sum()", "model(leaf).sum()")), "互不相连"),
    # forgets to leave i out
    "includes i": (_mutant(("if j != i and ", "if ")), "互不相连"),
    # tests whether a gradient row exists instead of whether it is zero
    "is not None": (_mutant(("bool(grad[j].ne(0).any())", "grad[j] is not None")), "互不相连"),
    # never switches to eval mode: training-mode BatchNorm mixes by design
    "no eval": (_mutant(*_NO_MODE), "BatchNorm"),
    # switches to eval mode and leaves the model there
    "stays in eval": (_mutant(("    model.train(was)\n", "")), "training=True"),
    # switches back to training mode whatever the mode was
    "always train()": (_mutant(("model.train(was)", "model.train()")), "training=False"),
    # a tolerance: the faint leak (gradients far below 1e-3) is missed
    "tolerance": (_mutant(("bool(grad[j].ne(0).any())", "grad[j].abs().max().item() > 1e-3")), "极弱"),
    # marks the caller's tensor as requiring gradients
    "caller's x": (_mutant(("x.detach().clone().requires_grad_(True)", "x.requires_grad_(True)")), "调用者的 x"),
    # backward() fills the parameters' .grad, which the learner's next optimizer step would add up
    "backward leaves .grad": (_mutant(("(grad,) = torch.autograd.grad(model(leaf)[i].sum(), leaf)",
                                       "model(leaf)[i].sum().backward()\n    grad = leaf.grad")), ".grad"),
    # an answer that claims no model ever mixes
    "empty set": ('''
    return set()''', "两个样本混在一起"),
    # a list instead of a set
    "list": (_mutant(("return {j", "return [j"), ("any())}", "any())]")), "set"),
    # forgets requires_grad: autograd.grad raises, and the check reports it
    "no requires_grad": (_mutant((".requires_grad_(True)", "")), "RuntimeError"),
}
