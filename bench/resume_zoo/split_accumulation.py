"""A split accumulation window: 3 micro-batches per optimizer step, a checkpoint every 2 micro-batches (so some
fall inside a window), holding the weights, the optimizer and the data position but not the gradients
accumulated so far; the resumed window starts again at 0 from the saved micro-batch.

Expected: gradient accumulation (the window split), at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402
from torch import nn  # noqa: E402

WINDOW = 3


class Bug(Run):
    def micro_step(self, x, y, micro: int) -> None:
        (nn.functional.cross_entropy(self.model(x), y) / WINDOW).backward()
        if micro % WINDOW == 0:  # counted from the resume: the window restarts there
            self.opt.step()
            self.opt.zero_grad()
            self.sched.step()
            self.ema.update(self.model)
            self.step += 1

    def main(self) -> None:
        if self.args.resume and self.path.exists():
            self.restore(__import__("torch").load(self.path, weights_only=False))
        micro = 0
        while self.step < self.args.steps:
            for x, y in self.batches():
                micro += 1
                self.micro_step(x, y, micro)
                self.batch += 1
                if self.batch % 2 == 0:
                    self.save()
                if self.step >= self.args.steps:
                    return
            self.end_epoch()


if __name__ == "__main__":
    Bug().main()
