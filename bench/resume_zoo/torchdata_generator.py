"""Found by the doctor (torchdata 0.11.0, torch 2.14.1): ``StatefulDataLoader(..., shuffle=True, generator=g)``
resumes the interrupted epoch exactly, but the next epoch is shuffled differently from the uninterrupted run. The
one generator feeds the sampler's permutation and then each iterator's seed; the saved sampler state is the
generator before the permutation, so a resume replays the permutation but not the seed drawn after it (with a
generator each for the sampler and the loader, ``stateful_loader.py``, it is exact).

Expected: data order, at the first step of the epoch after the resume."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
import torch  # noqa: E402
from stateful_loader import BATCH, Stateful, StatefulDataLoader  # noqa: E402


class Bug(Stateful):
    def stateful_loader(self) -> StatefulDataLoader:
        return StatefulDataLoader(self.train, BATCH, shuffle=True, generator=torch.Generator().manual_seed(self.args.seed))


if __name__ == "__main__":
    Bug().main()
