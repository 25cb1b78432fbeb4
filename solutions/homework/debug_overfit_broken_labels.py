"""debug_overfit.py with a deliberately injected label bug: it must FAIL its overfit test.

The bug imitated here: images and labels shuffled with two different permutations,
the labels' one drawn anew at every step (a label-only shuffle inside the loop). Every
step the same images arrive with a fresh, random assignment of their labels, so there is
nothing consistent to memorise: the loss stalls near the entropy of the batch's
label counts (about ln 10 ≈ 2.3 minus a little) and the script exits with code 1.

Contrast: a FIXED wrong mapping is memorised just as well as the right labels (a
label list shuffled once, cat<->dog for every sample), so the overfit test passes;
samples.png, or accuracy on correctly labelled validation data (near chance after a
one-time shuffle, near zero for swapped classes), exposes it.

    python notebooks/homework/debug_overfit_broken_labels.py --out runs/overfit_broken
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from debug_overfit import main  # noqa: E402


def reshuffled_labels(y: torch.Tensor, step: int) -> torch.Tensor:
    """The injected bug: labels permuted independently of the images, anew at every step."""
    g = torch.Generator().manual_seed(10_007 * step)
    return y[torch.randperm(len(y), generator=g).to(y.device)]


if __name__ == "__main__":
    sys.exit(main(label_fn=reshuffled_labels, name="debug_overfit_broken_labels"))
