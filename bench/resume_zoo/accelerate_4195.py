"""Accelerate #4195: ``load_state`` restores the cursor, not the shuffle order. One generator draws every
epoch's permutation; the checkpoint keeps (epoch, batch) but not the generator, so a resume in a later
epoch shuffles with a fresh generator: epoch 0's order.

Expected: data order (an earlier epoch replayed), at the first step after the epoch end."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


import torch  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402


class Bug(Run):
    def __init__(self) -> None:
        super().__init__()
        self.order = torch.Generator().manual_seed(self.args.seed)  # draws every epoch's permutation in turn

    def loader(self, epoch: int):
        return DataLoader(self.train, 8, sampler=RandomSampler(self.train, generator=self.order),
                          generator=torch.Generator().manual_seed(epoch))

if __name__ == "__main__":
    Bug().main()
