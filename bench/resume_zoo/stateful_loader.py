"""Control: the zoo's tiny run with torchdata's ``StatefulDataLoader``, whose ``state_dict()`` holds the data
position (the sampler's permutation and how far it got), saved in the checkpoint and loaded on resume. The
shuffle draws from the global generator (seeded by ``seed_all``, restored with the RNG states):
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

    def restore(self, s: dict) -> None:
        super().restore(s)
        self.data.load_state_dict(s["data"])

    def batches(self):
        return iter(self.data)  # picks up where the loaded state left off


if __name__ == "__main__":
    Stateful().main()
