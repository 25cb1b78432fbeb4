"""Found by the doctor (torchdata 0.11.0, torch 2.14.1): ``StatefulDataLoader(..., shuffle=True)`` without a
generator draws each iterator's seed from the global generator, the one dropout uses. The uninterrupted run drew
it when the epoch's iterator started, before the checkpoint; the resumed process draws it again after restoring
the saved RNG states, so its dropout masks move on by one draw. (No order of restoring cures it: mid-epoch,
restoring after ``iter()`` works, but after a state saved at an epoch end the first ``iter()`` builds two
iterators, the loaded finished one and the next epoch's: restored before ``iter()``, the resumed process draws
twice where the uninterrupted run drew once after the save; restored after it, not at all.)

Expected: RNG state (the loader drew more), at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from stateful_loader import BATCH, Stateful, StatefulDataLoader  # noqa: E402


class Bug(Stateful):
    def stateful_loader(self) -> StatefulDataLoader:
        return StatefulDataLoader(self.train, BATCH, shuffle=True)


if __name__ == "__main__":
    Bug().main()
