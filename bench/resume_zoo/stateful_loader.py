"""Control: the zoo's tiny run with torchdata's ``StatefulDataLoader``, whose ``state_dict()`` holds the data
position (the sampler's permutation and how far it got), saved in the checkpoint and loaded on resume. The
sampler (torchdata's stateful ``RandomSampler``) and the loader each get a generator of their own, so the loader
draws nothing from the global generator (the one dropout uses) and the saved RNG states hold for the resumed
iterator too. Two variants are bugs found here: one generator for both (``torchdata_generator.py``) and none
(``torchdata_global.py``)."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
import torch  # noqa: E402
from common import BATCH, Run  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from torchdata.stateful_dataloader.sampler import RandomSampler  # noqa: E402


class Stateful(Run):
    def __init__(self) -> None:
        super().__init__()
        self.data = self.stateful_loader()

    def stateful_loader(self) -> StatefulDataLoader:
        order = RandomSampler(self.train, generator=torch.Generator().manual_seed(self.args.seed))
        return StatefulDataLoader(self.train, BATCH, sampler=order, generator=torch.Generator().manual_seed(self.args.seed + 1))

    def state(self) -> dict:
        return {**super().state(), "data": self.data.state_dict()}

    def restore(self, s: dict) -> None:
        super().restore(s)
        self.data.load_state_dict(s["data"])

    def batches(self):
        return iter(self.data)  # picks up where the loaded state left off


if __name__ == "__main__":
    Stateful().main()
