"""ms-swift #10050: the sampler rebuilt on resume replays epoch 0's order: its seed ignores the epoch it resumes in.

Expected: data order (an earlier epoch replayed), at the first step after the epoch end."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    resumed = False

    def restore(self, s: dict) -> None:
        super().restore(s)
        self.resumed = True

    def loader(self, epoch: int):
        rebuilt, self.resumed = self.resumed, False
        return super().loader(0 if rebuilt else epoch)

if __name__ == "__main__":
    Bug().main()
