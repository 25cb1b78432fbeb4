"""A split accumulation window: 3 micro-batches per optimizer step, checkpoints after every micro-batch while the
step count is a multiple of ``--every``, 0 included (so they fall inside windows: the count moves only when a
window closes), holding the weights, the optimizer and the data position but not the gradients accumulated so
far; the resumed process counts its window from 0 again.

Expected: gradient accumulation (the window split), at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402
from torch import nn  # noqa: E402

WINDOW = 3


class Bug(Run):
    micro = 0  # micro-batches of this process: the window restarts at a resume

    def train_step(self, x, y) -> None:
        self.backward(nn.functional.cross_entropy(self.model(x), y) / WINDOW)
        self.micro += 1
        if self.micro % WINDOW == 0:
            self.update()


if __name__ == "__main__":
    Bug().main()
