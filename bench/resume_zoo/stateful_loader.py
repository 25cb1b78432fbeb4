"""Control: the zoo's tiny run with torchdata's ``StatefulDataLoader``, whose ``state_dict()`` holds the data
position (the sampler's permutation and how far it got), saved in the checkpoint and loaded on resume. The
shuffle draws from the global generator (seeded by ``seed_all``), and a resumed iterator draws from it when it
starts: the saved RNG states go back after the resumed iterator is made mid-epoch (the uninterrupted run's had
drawn before the save), before it at an epoch end (the uninterrupted run's next one drew after the save).
``torchdata_generator.py`` passes its own generator instead, and the epoch after a resume changes order."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
import torch  # noqa: E402
from common import BATCH, Run  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402


class Stateful(Run):
    def __init__(self) -> None:
        super().__init__()
        self.data = StatefulDataLoader(self.train, BATCH, shuffle=True, generator=self.generator())

    def generator(self) -> torch.Generator | None:
        return None

    def state(self) -> dict:
        return {**super().state(), "data": self.data.state_dict()}

    pending = None  # the RNG states to restore once the resumed iterator exists

    def restore(self, s: dict) -> None:
        super().restore({k: v for k, v in s.items() if k != "rng"})
        self.data.load_state_dict(s["data"])
        self.pending = s["rng"]

    def batches(self):
        if self.batch == 0:  # an epoch end: the uninterrupted run's next iterator drew after the save
            self.put_back_rng()
        batches = iter(self.data)  # picks up where the loaded state left off; its start draws from the global RNG
        self.put_back_rng()  # mid-epoch: the uninterrupted run's iterator had drawn before the save
        return batches

    def put_back_rng(self) -> None:
        if self.pending is not None:
            super().restore({"where": (self.step, self.epoch, self.batch), "rng": self.pending})
            self.pending = None


if __name__ == "__main__":
    Stateful().main()
