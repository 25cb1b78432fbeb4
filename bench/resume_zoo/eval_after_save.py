"""The eval-after-save slip: the epoch-end checkpoint is written before the evaluation, whose plain DataLoader
draws a seed from the global generator; the uninterrupted run trains on from the drawn state, a resume from the saved one.

Expected: RNG state (drawn between the save and the next step), at the first step after the epoch end."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def end_epoch(self) -> None:
        self.epoch, self.batch = self.epoch + 1, 0
        self.save()
        self.evaluate()

if __name__ == "__main__":
    Bug().main()
