"""Lightning #21938: since 2.5.3 the first epoch after an end-of-epoch checkpoint replays epoch 0's permutation
whenever ``num_workers > 0`` (the sampler's epoch is not set on the rebuilt loader).

Expected: data order (an earlier epoch replayed), at the first step after the epoch end."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    workers = 1
    rebuilt = False

    def restore(self, s: dict) -> None:
        super().restore(s)
        self.rebuilt = self.batch == 0 and self.workers > 0

    def loader(self, epoch: int):
        first, self.rebuilt = self.rebuilt, False
        return super().loader(0 if first else epoch)

if __name__ == "__main__":
    Bug().main()
