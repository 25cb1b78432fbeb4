"""Typical wrong answers of notebook 02_grad_clipping exercise 3: accumulated_step (each wrong answer is the solution with one edit).

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

def mutant(solution: str, *edits: tuple[str, str]) -> str:
    """The solution with the learner's mistake: each (old, new) replaced once."""
    for old, new in edits:
        assert old in solution, old
        solution = solution.replace(old, new, 1)
    return solution


_ZERO = "    optimizer.zero_grad(set_to_none=True)\n"
_CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
_STEP = "    optimizer.step()\n"
_BACKWARD = "        loss.backward()\n"

# name -> (edits to the solution, a fragment the failure message must contain)
WRONG = {
    # the mean of the micro-batches' means: uneven sizes are weighted wrongly
    "mean of means": ((("(len(y) / total)", "(1 / len(micro_batches))"),), "n_i / N"),
    # divides by the number of samples of the first micro-batch times K (the usual "loss / K" with N = K * n)
    "divided by K * first size": ((("(len(y) / total)", "(len(y) / (len(micro_batches) * len(micro_batches[0][1])))"),),
                                  "期望"),
    # the sum of the micro-batches' means: no weight at all
    "sum of means": ((("* (len(y) / total)", ""),), "直接相加"),
    # zero_grad inside the micro-batch loop: only the last micro-batch's gradient survives
    "zero_grad inside the loop": (((_ZERO, ""), ("        loss = F.", "        optimizer.zero_grad()\n        loss = F.")),
                                  "最后一个微批次"),
    # forgets zero_grad at the start: the stale gradients are added to the window's
    "no zero_grad (stale grads)": (((_ZERO, ""),), "zero_grad 一次"),
    # clips after every backward instead of once on the accumulated gradient
    "clip per micro-batch": (((_CLIP, ""), (_BACKWARD, _BACKWARD + "    " + _CLIP)), "每次 backward 之后"),
    # never clips
    "no clipping": (((_CLIP, ""),), "没有裁剪"),
    # steps once per micro-batch
    "step per micro-batch": (((_STEP, ""), (_BACKWARD, _BACKWARD + "    " + _STEP)), "只调用一次"),
    # forgets the step
    "no step": (((_STEP, ""),), "optimizer.step()"),
    # returns the last micro-batch's (unweighted) loss
    "returns the last loss": ((("    return window_loss\n",
                                "    return F.cross_entropy(model(x), y).item()\n"),), "多做了前向"),
    # returns the last micro-batch's weighted loss only (overwrites instead of adding)
    "returns last weighted loss": ((("window_loss += loss.item()", "window_loss = loss.item() / (len(y) / total)"),),
                                   "最后一个微批次的 loss"),
    # returns the mean of the micro-batches' mean losses
    "returns mean of means": ((("window_loss += loss.item()", "window_loss += loss.item() / (len(y) / total) / len(micro_batches)"),),
                              "各微批次 loss 的平均"),
    # clips before the last micro-batch's backward
    "clip before the last backward": (((_CLIP, ""), ("    for x, y in micro_batches:\n",
                                                     "    for i, (x, y) in enumerate(micro_batches):\n"),
                                       ("        loss.backward()\n",
                                                     "        if i == len(micro_batches) - 1:\n"
                                                     "            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
                                                     "        loss.backward()\n")), "期望"),
    # concatenates the micro-batches into one big batch: the memory accumulation is meant to save
    "one big batch": ((("    for x, y in micro_batches:\n        loss = F.cross_entropy(model(x), y) * (len(y) / total)\n",
                        "    for x, y in [(torch.cat([a for a, _ in micro_batches]), torch.cat([b for _, b in micro_batches]))]:\n"
                        "        loss = F.cross_entropy(model(x), y) * (len(y) / total)\n"),), "拼成一个大 batch"),
    # returns nothing
    "returns None": ((("    return window_loss\n", ""),), "None"),
}
